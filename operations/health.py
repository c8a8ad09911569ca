"""The health page's checks: each green or red, with the reason in a sentence.

Every check is read-only and bounded: the reconciler's findings are its own queries run without
re-driving anything, and the ledger's invariant check (a scan of every allocation) runs in a
beat task whose last verdict is read here.
"""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

import celery
from django.conf import settings
from django.db import connection
from django.db.models import Count, Q

from jobs import reconciler as reconciler_queries
from jobs.models import Node
from jobs.reconciler import Findings
from operations import supervisor
from operations.models import HealthProbe

SHOWN_IDS = 20
# Beat entries (e31web/settings.py) whose results this page reads; their staleness follows their period.
BEAT_ENTRY = "operations-beat-heartbeat"
LEDGER_ENTRY = "operations-ledger-check"


def beat_period_s(entry: str, default: float) -> float:
    schedule = settings.CELERY_BEAT_SCHEDULE.get(entry, {}).get("schedule", default)
    return schedule.total_seconds() if isinstance(schedule, timedelta) else float(schedule)


@dataclass(frozen=True)
class Check:
    key: str
    name: str
    ok: bool
    summary: str
    detail: list[str] = field(default_factory=list)
    pending: bool = False  # not run yet, and not yet due: neither green nor red


def beat_silence_limit() -> timedelta:
    """Three missed heartbeats, and never under a minute: one late tick is not an outage."""
    return timedelta(seconds=max(60.0, 3 * beat_period_s(BEAT_ENTRY, 15.0)))


UP_SINCE = "up since "


def beat_up_since(probe: HealthProbe | None) -> datetime | None:
    """When the running beat started (its first heartbeat after a silence), as its heartbeat row notes it."""
    if probe is None or not probe.detail.startswith(UP_SINCE):
        return None
    return datetime.fromisoformat(probe.detail.removeprefix(UP_SINCE))


def run_all(*, now: datetime) -> list[Check]:
    probes = {p.name: p for p in HealthProbe.objects.all()}
    return [
        broker(),
        database(),
        agents(now=now),
        beat(probes.get("beat"), now=now),
        reconciler(now=now),
        ledger(probes.get("ledger"), beat_probe=probes.get("beat"), now=now),
        *console(probes.get(supervisor.PROBE)),
    ]


def broker() -> Check:
    try:
        # The project's Celery app (e31web.celery), current since Django loaded its settings.
        with celery.current_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=0)  # one attempt, bounded by the connect timeout
            transport = conn.transport_cls
    except Exception as exc:  # any failure to connect is the finding itself
        return Check("broker", "Broker", False, f"unreachable: {type(exc).__name__}: {exc}")
    return Check("broker", "Broker", True, f"reachable ({transport} transport)")


def database() -> Check:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # the page may still render from cache-free parts; say why
        return Check("database", "Database", False, f"unreachable: {type(exc).__name__}: {exc}")
    return Check("database", "Database", True, f"reachable ({connection.vendor})")


def agents(*, now: datetime) -> Check:
    """Live nodes whose agent beat within the reaper's timeout, against every live node; and the nodes the platform
    declared down (silent past the timeout), which no operator marked down nor retired: red until each is back
    or retired, or the lost node leaves the count and the page reads green."""
    cutoff = now - timedelta(seconds=settings.E31_NODE_TIMEOUT_S)
    live, fresh = ~Q(state=Node.NodeState.DOWN), Q(last_heartbeat__gte=cutoff)
    lost = Q(state=Node.NodeState.DOWN, held_down_by="", retired_at__isnull=True)
    counts = Node.objects.aggregate(
        total=Count("id", filter=live), fresh=Count("id", filter=live & fresh), lost=Count("id", filter=lost)
    )
    total, ok, lost_count = counts["total"], counts["fresh"], counts["lost"]
    if total == 0:
        return _no_live_node()
    summary = f"{ok} of {total} live nodes beat within {settings.E31_NODE_TIMEOUT_S:g} s"
    names = Node.objects.order_by("name").values_list("name", flat=True)
    silent = list(names.filter(live).exclude(fresh)[:SHOWN_IDS]) if ok < total else []
    gone = list(names.filter(lost)[:SHOWN_IDS]) if lost_count else []
    if lost_count:
        summary += f"; {lost_count} lost (declared down when it fell silent: bring it back, or retire it)"
    detail = [f"silent: {n}" for n in silent] + [f"lost: {n}" for n in gone]
    return Check("agents", "Agents reporting", ok == total and not lost_count, summary, detail)


def _no_live_node() -> Check:
    """Every node down (a power cut, say) is not a setup problem: name the dead machines (not the retired ones)."""
    down = Node.objects.filter(state=Node.NodeState.DOWN, retired_at__isnull=True).order_by("name")
    count = down.count()
    if count == 0:  # retired nodes were decommissioned on purpose: not named as dead machines
        return Check(
            "agents",
            "Agents reporting",
            False,
            "no live nodes: no agent has registered (retired nodes aside)",
        )
    names = list(down.values_list("name", flat=True)[:SHOWN_IDS])
    return Check(
        "agents", "Agents reporting", False, f"no live nodes: all {count} down", [f"down: {n}" for n in names]
    )


def beat(probe: HealthProbe | None, *, now: datetime) -> Check:
    limit = beat_silence_limit()
    if probe is None:
        return Check("beat", "Beat", False, "no heartbeat recorded yet: is celery beat running?")
    age = (now - probe.at).total_seconds()
    ok = now - probe.at <= limit
    state = "alive" if ok else f"silent past {limit.total_seconds():g} s"
    return Check("beat", "Beat", ok, f"{state}: last heartbeat {age:.0f} s ago")


def stuck(*, now: datetime) -> Findings:
    """What the reconciler would re-drive now: its own queries (``jobs.reconciler``), read-only."""
    stale = now - timedelta(seconds=settings.E31_RECONCILE_AFTER_S)
    return Findings(
        restaged=_shown(reconciler_queries.to_restage(stale)),
        restarted=_shown(reconciler_queries.unstarted(stale)),
        abandoned=_shown(reconciler_queries.silent(stale)),
        redelivered=_shown(reconciler_queries.undelivered(stale)),
    )


def _shown(rows) -> list[int]:
    return list(rows.values_list("id", flat=True)[: SHOWN_IDS + 1])


def reconciler(*, now: datetime) -> Check:
    findings = stuck(now=now)
    after = f"{settings.E31_RECONCILE_AFTER_S:g} s"
    if not findings.total():
        return Check("reconciler", "Reconciler findings", True, f"nothing stuck past {after}")
    detail = [
        _ids(f"jobs stuck before staging (the reconciler restages them past {after})", findings.restaged),
        _ids("allocations rented but never started (run message re-sent)", findings.restarted),
        _ids("jobs whose agent stopped reporting (released, requeued if allowed)", findings.abandoned),
        _ids("allocations whose outputs are not delivered (delivery re-sent)", findings.redelivered),
    ]
    return Check(
        "reconciler", "Reconciler findings", False, f"work stuck past {after}", [d for d in detail if d]
    )


def _ids(label: str, ids: list[int]) -> str:
    if not ids:
        return ""
    more = "+" if len(ids) > SHOWN_IDS else ""
    return f"{min(len(ids), SHOWN_IDS)}{more} {label}: " + ", ".join(f"#{i}" for i in ids[:SHOWN_IDS])


def console(probe: HealthProbe | None) -> list[Check]:
    """The embedded console's processes (``make run``); absent where no console supervises them."""
    if probe is None:
        return []
    head, *lines = probe.detail.splitlines() or [""]
    when = f"as of {probe.at:%Y-%m-%d %H:%M:%S} UTC"
    return [Check("console", "Console processes", probe.ok, f"{head} ({when})", lines)]


def ledger(probe: HealthProbe | None, *, beat_probe: HealthProbe | None = None, now: datetime) -> Check:
    limit = timedelta(seconds=2 * beat_period_s(LEDGER_ENTRY, 600.0) + 60)
    if probe is None:
        return _ledger_not_run(beat_up_since(beat_probe), limit=limit, now=now)
    when = f"checked {probe.at:%Y-%m-%d %H:%M:%S} UTC"
    if now - probe.at > limit:
        return Check("ledger", "Ledger check", False, f"stale: last {when}", probe.detail.splitlines())
    if not probe.ok:
        return Check(
            "ledger", "Ledger check", False, f"invariants broken ({when})", probe.detail.splitlines()
        )
    return Check("ledger", "Ledger check", True, f"every allocation's rows tile RENT..RELEASE ({when})")


def _ledger_not_run(up_since: datetime | None, *, limit: timedelta, now: datetime) -> Check:
    """Never run: pending on a fresh start (beat runs it within its period), red once it is overdue."""
    if up_since is not None and now - up_since > limit:
        summary = f"not run since beat started at {up_since:%Y-%m-%d %H:%M:%S} UTC: check now"
        return Check("ledger", "Ledger check", False, summary)
    every = f"{beat_period_s(LEDGER_ENTRY, 600.0) / 60:g} min"
    summary = f"not run yet: beat runs it every {every} after it starts, or check now"
    return Check("ledger", "Ledger check", True, summary, pending=True)
