"""The meter's writers: accrual, the final period at RELEASE, corrections, the reconciliation, and
teams' monthly budgets (operators set them; ``metering.selectors.projection`` reads them).

Invariants: metered rows (accrual, final) tile each allocation's RENT..RELEASE exactly, one row
per UTC hour, in microseconds, so their sum equals RELEASE - RENT with no rounding; no row is
ever updated or deleted (the model and a database trigger refuse); every writer inserts with
ON CONFLICT DO NOTHING against the unique (allocation, period start), so running any of them
twice, or two at once, adds nothing.
"""

import itertools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from accounts.models import Team
from common.ledger_locks import lock_team_ledgers
from jobs import clock, nodes
from jobs.models import Allocation, Job
from metering import invariants, signals, summaries
from metering.models import MeterEntry
from metering.periods import floor_hour, gpu_hours, hour_slices, micros, spread_over_hours

log = logging.getLogger(__name__)

ACCRUAL = MeterEntry.Kind.ACCRUAL
FINAL = MeterEntry.Kind.FINAL
ADJUSTMENT = MeterEntry.Kind.ADJUSTMENT
METERED = (ACCRUAL, FINAL)
BATCH = 2000
# Accrual leaves the last minute alone: a RELEASE whose `now` was taken just before an hour
# boundary may still be on its way, and its final row must not find that hour already closed.
ACCRUAL_GRACE = timedelta(seconds=60)


def accrue_meter(*, now: datetime) -> int:
    """Closes every completed UTC hour of every held allocation; idempotent, and back-fills any outage.

    Silent nodes are reaped first: after an outage of beat itself, their parts are released when the reaper
    would have found them, rather than every hour since counted as held."""
    try:
        nodes.reap_silent_nodes(now=now)
    except Exception:  # the reaper's own beat task tries again in seconds; the hours are closed regardless
        log.exception("reaping silent nodes before the accrual failed; accruing anyway")
    cutoff = floor_hour(now - ACCRUAL_GRACE)
    with transaction.atomic():
        rows = [row for held in _held_behind(cutoff) for row in _accrual_rows(held, cutoff=cutoff, now=now)]
        rows.sort(key=lambda row: (row.team_id, row.period_start))
        lock_team_ledgers({row.team_id for row in rows})
        MeterEntry.objects.bulk_create(rows, batch_size=BATCH, ignore_conflicts=True)
    if rows:
        log.info("meter: offered %d hourly rows up to %s", len(rows), cutoff)
    return len(rows)


def _held_behind(cutoff: datetime) -> list[Allocation]:
    """Held allocations with hours before ``cutoff`` not closed yet, locked against a concurrent RELEASE.

    The allocation and its job are both locked, SKIP LOCKED: RELEASE locks the job first, so an
    allocation being released is skipped (RELEASE closes every hour itself) and accrual never
    waits on a RELEASE, which rules out a deadlock; a second accrual skips what the first holds.
    """
    last_end = (
        MeterEntry.objects.filter(allocation=OuterRef("pk"), kind__in=METERED)
        .order_by("-period_start")
        .values("period_end")[:1]
    )
    return list(
        Allocation.objects.select_for_update(skip_locked=True, no_key=True, of=("self", "job"))
        .filter(released_at__isnull=True, rented_at__lt=cutoff)
        .annotate(last_end=Subquery(last_end))
        .filter(Q(last_end__isnull=True) | Q(last_end__lt=cutoff))
        .select_related("job")
        .only("id", "gpu_indices", "rented_at", "job__id", "job__team_id")
        .order_by("id")
    )


def _accrual_rows(held: Allocation, *, cutoff: datetime, now: datetime) -> Iterator[MeterEntry]:
    for period_start, period_end in hour_slices(held.last_end or held.rented_at, cutoff):
        yield MeterEntry(
            allocation_id=held.id, job_id=held.job_id, team_id=held.job.team_id,
            period_start=period_start, period_end=period_end, gpus=held.gpu_count,
            microseconds=micros(period_end - period_start), kind=ACCRUAL, created_at=now,
        )  # fmt: skip


@transaction.atomic
def close_meter(*, allocation_id: int, released_at: datetime) -> int:
    """Writes every period of RENT..RELEASE not closed yet, the last one final: the metered rows then sum to RELEASE - RENT exactly."""
    allocation = Allocation.objects.select_related("job").get(id=allocation_id)
    rows = [
        MeterEntry(
            allocation_id=allocation.id, job_id=allocation.job_id, team_id=allocation.job.team_id,
            period_start=start, period_end=end, gpus=allocation.gpu_count,
            microseconds=micros(end - start), kind=FINAL if end == released_at else ACCRUAL,
            created_at=released_at,
        )
        for start, end in hour_slices(allocation.rented_at, released_at)
    ]  # fmt: skip
    # From RENT, not from the last closed hour: the conflicts cost nothing and any gap is filled.
    lock_team_ledgers({allocation.job.team_id})
    MeterEntry.objects.bulk_create(rows, batch_size=BATCH, ignore_conflicts=True)
    _report_overshoot(allocation_id=allocation_id, released_at=released_at)
    return len(rows)


@transaction.atomic
def credit_never_ran(*, allocation_id: int, why: str) -> None:
    """Credits a released allocation whose job's process the platform never ran (``why``): what is left of its
    metered time after any credit an operator booked already, signed by nobody, over its hours as metered rows
    are cut (each hour to zero, when nothing was credited before). Once: a second credit of an hour is refused
    by the ledger (``meter_one_platform_credit_per_period``)."""
    # The one lock order (common.ledger_locks): the job's row (the release holds it), then the team's ledger.
    allocation = Allocation.objects.select_related("job").get(id=allocation_id, released_at__isnull=False)
    lock_team_ledgers({allocation.job.team_id})
    left = sum(MeterEntry.objects.filter(allocation_id=allocation.id).values_list("microseconds", flat=True))
    if left <= 0:
        return
    rows = [
        MeterEntry(
            allocation_id=allocation.id, job_id=allocation.job_id, team_id=allocation.job.team_id,
            period_start=begin, period_end=stop, gpus=allocation.gpu_count, microseconds=share,
            kind=ADJUSTMENT, reason=f"credited by the platform: the job's process never ran ({why})"[:300],
            created_at=allocation.released_at,
        )
        for begin, stop, share in spread_over_hours(allocation.rented_at, allocation.released_at, -left)
    ]  # fmt: skip
    MeterEntry.objects.bulk_create(rows, batch_size=BATCH, ignore_conflicts=True)


def _report_overshoot(*, allocation_id: int, released_at: datetime) -> None:
    # A RELEASE is dated no earlier than the hours its meter closed (jobs.signals.meter_closed_until), so this
    # is a guard: rows are never removed, and a period past the RELEASE could only be reported (check_ledger).
    beyond = MeterEntry.objects.filter(
        allocation_id=allocation_id, kind__in=METERED, period_end__gt=released_at
    )
    if beyond.exists():
        log.error("meter: allocation %s has rows past its RELEASE at %s", allocation_id, released_at)


@transaction.atomic
def adjust_meter(
    *,
    allocation_id: int,
    microseconds: int,
    reason: str,
    author,
    now: datetime,
    adjusted_seen: int | None = None,
) -> list[MeterEntry]:
    """Appends a signed correction with its reason and author, cut at the UTC hours like metered rows;
    metered rows are never touched, and the allocation's total never goes below zero. ``adjusted_seen``: the
    allocation's adjustments (GPU-microseconds) the author saw; ValueError if others were booked since."""
    reason = reason.strip()
    if not reason or microseconds == 0:
        raise ValueError("an adjustment needs a reason and a non-zero amount")
    if not getattr(author, "is_staff", False):
        raise PermissionError("only operators adjust the ledger")
    # The one lock order (common.ledger_locks): the job's row, then the allocation's, then the team's ledger.
    job_id = Allocation.objects.values_list("job_id", flat=True).get(id=allocation_id)
    list(Job.objects.select_for_update().filter(id=job_id))
    allocation = (
        Allocation.objects.select_for_update(of=("self",)).select_related("job").get(id=allocation_id)
    )
    if adjusted_seen is not None and _gpu_micros(allocation_id, kind=ADJUSTMENT) != adjusted_seen:
        raise ValueError(
            "another adjustment was recorded on this allocation since this page was shown (listed above): "
            "look again before you record this one"
        )
    total = _gpu_micros(allocation_id) + allocation.gpu_count * microseconds
    if total < 0:
        raise ValueError("this credit is larger than the GPU-time the allocation was metered")
    end = allocation.released_at or now
    held = allocation.gpu_count * micros(end - allocation.rented_at)
    if microseconds > 0 and total > held:  # a typo (hours as seconds) charged 4,000 GPU-hours for 137 s held
        raise ValueError(
            f"this charge would bring the allocation to more than the allocation held: its {allocation.gpu_count} "
            f"GPU(s) from RENT to {'RELEASE' if allocation.released_at else 'now'}, "
            f"{gpu_hours(held):.3f} GPU-hours"
        )
    lock_team_ledgers({allocation.job.team_id})
    # The correction covers the last |microseconds| of the meter (no earlier than RENT), cut at the
    # hours the metered rows are cut at: a credit across a month's end is booked in both months.
    # The window is never longer than the amount, so no hour's share rounds to zero.
    start = max(allocation.rented_at, end - timedelta(microseconds=abs(microseconds)))
    rows = [
        MeterEntry(
            allocation=allocation, job_id=allocation.job_id, team_id=allocation.job.team_id,
            period_start=begin, period_end=stop, gpus=allocation.gpu_count, microseconds=share,
            kind=ADJUSTMENT, reason=reason[:300], created_by=author, created_at=now,
        )
        for begin, stop, share in spread_over_hours(start, end, microseconds)
    ]  # fmt: skip
    signals.ledger_adjusted.send(
        sender=MeterEntry, team=allocation.job.team, allocation=allocation.id, job=allocation.job_id,
        gpu_micros=allocation.gpu_count * microseconds, reason=reason, operator=author, now=now,
    )  # fmt: skip
    return MeterEntry.objects.bulk_create(rows, batch_size=BATCH)


def _gpu_micros(allocation_id: int, kind: str | None = None) -> int:
    rows = MeterEntry.objects.filter(allocation_id=allocation_id)
    if kind is not None:
        rows = rows.filter(kind=kind)
    return sum(gpus * us for gpus, us in rows.values_list("gpus", "microseconds"))


def accrual_lag() -> timedelta:
    """How far behind the clock accrual may legitimately be: its beat interval plus its grace."""
    entry = settings.CELERY_BEAT_SCHEDULE.get("accrue-meter-hourly", {})
    every = entry.get("schedule", 300.0)
    every_s = every.total_seconds() if isinstance(every, timedelta) else float(every)
    return timedelta(seconds=every_s) + ACCRUAL_GRACE + timedelta(minutes=1)


FUTURE_GRACE = timedelta(minutes=1)


def find_violations(*, now: datetime | None = None) -> list[str]:
    """Every breach of the ledger's invariants, one line each; an empty list means every allocation's rows tile
    RENT..RELEASE exactly, and none is dated after the database's clock (read once the snapshot is taken, so that
    everything it holds was committed before; with a minute's grace for a writer's clock a little ahead)."""
    now = now or timezone.now()
    closed_until = now - accrual_lag()
    with _snapshot():
        latest = max(now, clock.database_now()) + FUTURE_GRACE
        found = [
            f"allocation {held.id} (job {held.job_id}): {problem}"
            for held, rows in _allocations_with_rows()
            for problem in invariants.problems(held, rows, closed_until=closed_until, now=latest)
        ]
        return found + invariants.shared_gpus(_spans()) + _summary_drift()


def _summary_drift() -> list[str]:
    """Summary rows (per team-day, per job-month) that differ from the sums of the ledger rows they stand for."""
    found = []
    with connection.cursor() as cursor:
        for table, sql in summaries.drift_sql(connection.vendor):
            cursor.execute(sql)
            found += [
                f"summary {table} ({', '.join(map(str, key))}) differs from its ledger rows"
                for key in cursor.fetchall()
            ]
    return found


@contextmanager
def _snapshot() -> Iterator[None]:
    """One consistent view for both cursors, so a RELEASE committing midway is not a false alarm."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


def _spans() -> Iterator[invariants.Span]:
    """Every allocation's GPUs and span, by node and RENT, streamed."""
    rows = Allocation.objects.order_by("node__name", "rented_at", "id").values_list(
        "id", "node__name", "gpu_indices", "rented_at", "released_at"
    )
    for id_, node, indices, rented_at, released_at in rows.iterator(chunk_size=BATCH):
        yield invariants.Span(id_, node, tuple(indices), rented_at, released_at)


def _allocations_with_rows() -> Iterator[tuple[invariants.Held, list[invariants.Row]]]:
    """Allocations and their ledger rows, merged in id order from two streaming cursors."""
    allocations = (
        Allocation.objects.order_by("id")
        .values_list("id", "job_id", "job__team_id", "gpu_indices", "rented_at", "released_at")
        .iterator(chunk_size=BATCH)
    )
    entries = (
        MeterEntry.objects.order_by("allocation_id", "period_start", "id")
        .values_list(
            "allocation_id", "job_id", "team_id", "period_start", "period_end", "gpus", "microseconds", "kind"
        )
        .iterator(chunk_size=BATCH * 5)
    )
    groups = itertools.groupby(entries, key=lambda e: e[0])
    pending = next(groups, None)
    for id_, job_id, team_id, indices, rented_at, released_at in allocations:
        rows: list[invariants.Row] = []
        if pending is not None and pending[0] == id_:
            rows = [invariants.Row(*e[1:]) for e in pending[1]]
            pending = next(groups, None)
        yield invariants.Held(id_, job_id, team_id, len(indices), rented_at, released_at), rows


@transaction.atomic
def set_budget(*, team_id: int, gpu_hours: Decimal | None, enforced: bool, operator, now: datetime) -> Team:
    """Sets a team's monthly GPU-hour budget and whether it refuses jobs; operators only. The change
    is announced (``signals.budget_set``, for the audit log) in the same transaction."""
    if not getattr(operator, "is_staff", False):
        raise PermissionError("only operators set budgets")
    if gpu_hours is not None and gpu_hours < 0:
        raise ValueError("a budget cannot be negative")
    team = Team.objects.select_for_update().get(id=team_id)
    before = _budget_of(team)
    team.monthly_budget_gpu_hours = gpu_hours
    team.budget_enforced = enforced
    team.save(update_fields=["monthly_budget_gpu_hours", "budget_enforced"])
    signals.budget_set.send(
        sender=Team, team=team, before=before, after=_budget_of(team), operator=operator, now=now
    )
    log.info(
        "budget: %s set team %s to %s GPU-hours/month (enforced=%s) at %s",
        operator, team.slug, gpu_hours, enforced, now.isoformat(),
    )  # fmt: skip
    return team


def _budget_of(team: Team) -> dict:
    return {
        "monthly_budget_gpu_hours": team.monthly_budget_gpu_hours,
        "budget_enforced": team.budget_enforced,
    }
