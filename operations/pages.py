"""Read models for the queue, utilisation, jobs, teams and audit pages: filters and bounded queries.

Each function here runs a fixed number of queries whatever the number of jobs or nodes (lists are
paginated, per-row extras are fetched for the page in one query), which the tests assert.
"""

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, time, timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.db.models import Count, QuerySet, Sum
from django.utils.dateparse import parse_date
from django.utils.safestring import SafeString

from accounts import team_secrets
from accounts.models import Team
from jobs import rental, units
from jobs import selectors as jobs_selectors
from jobs.lifecycle import BEFORE_RENT, HOLDS_COMPUTE, EndReason, State
from jobs.models import Allocation, GpuHold, Job, Node, TeamLogBytes, TeamUsage
from metering import selectors as metering_selectors
from operations import charts, utilisation
from operations.models import AuditEntry, TeamBusySample

WAITING_STATES = [State.SUBMITTED.value, State.STAGING.value, State.QUEUED.value]
LIST_FIELDS = (
    "id", "name", "team__name", "team__slug", "state", "end_reason", "gpus", "min_gpus", "hours",
    "submitted_at", "state_changed_at", "cancel_requested_at", "attempt", "requeue", "exit_code",
    "checkpoint_signal", "checkpoint_held_bytes",  # a pausable job between attempts reads "paused"
    "lost_attempts", "array", "array_index",  # an array task names its index
)  # fmt: skip
QUEUE_FIELDS = (
    *LIST_FIELDS,
    "priority",
    "priority_detail",
    "estimated_start",
    "pending_reason",
    "preemptible",
)


def parse_number(raw: str) -> float:
    """A float from a form field, NaN when it is not a number (the service then refuses it)."""
    try:
        return float(raw)
    except ValueError:
        return float("nan")


def _query(values: Mapping[str, str]) -> str:
    return urlencode({k: v for k, v in values.items() if v})


# --------------------------------------------------------------------------- queue


@dataclass(frozen=True)
class QueueFilters:
    team: str = ""
    size: str = ""
    state: str = ""

    @classmethod
    def from_query(cls, get: Mapping[str, str]) -> "QueueFilters":
        size, state = get.get("size", ""), get.get("state", "")
        return cls(
            team=get.get("team", ""),
            size=size if size in jobs_selectors.SIZE_CLASSES else "",
            state=state if state in WAITING_STATES else "",
        )

    def apply(self, jobs: QuerySet) -> QuerySet:
        if self.team:
            jobs = jobs.filter(team__slug=self.team)
        jobs = jobs_selectors.of_size(
            jobs, self.size
        )  # the members' queue's size classes, so both filter alike
        if self.state:
            jobs = jobs.filter(state=self.state)
        return jobs

    @property
    def query(self) -> str:
        return _query(asdict(self))


def waiting_jobs() -> QuerySet:
    """Every job not yet rented, in the scheduler's priority order (unranked ones last, oldest first)."""
    return (
        Job.objects.filter(state__in=BEFORE_RENT)
        .select_related("team")
        .only(*QUEUE_FIELDS)
        .order_by(*jobs_selectors.QUEUE_ORDER)
    )


def attach_reservations(page: Iterable[Job]) -> None:
    """Sets ``job.reservation`` on each listed job, as the latest utilisation sample recorded it (one query)."""
    sample = utilisation.latest()
    held_by = sample.reservations if sample else {}
    for job in page:
        held = held_by.get(str(job.id))
        job.reservation = _describe_reservation(held) if held else ""


def _describe_reservation(held: dict) -> str:
    where = "; ".join(units.gpus_on(node, ix) for node, ix in held["gpus_by_node"].items())
    return f"{where or 'GPUs to be named'} from {held['start_at'][:16].replace('T', ' ')} UTC"


# --------------------------------------------------------------------------- utilisation


SLOT_FORMATS = {"24h": ("%H:%M", "%H:%M"), "7d": ("%a %d %b %H:%M", "%a %d"), "30d": ("%d %b %H:%M", "%d %b")}


@dataclass(frozen=True)
class UtilisationCharts:
    pool: SafeString
    teams: SafeString
    totals: SafeString
    team_totals: list[tuple[Team | None, float, str]]  # team, GPU-hours, colour class
    samples: int
    expected_samples: int
    busy_gpu_hours: float
    waste_gpu_hours: float
    reserved_gpu_hours: float
    latest: object


def utilisation_charts(*, window: utilisation.Window, now: datetime) -> UtilisationCharts:
    """Both charts of one window, from stored samples only (three queries)."""
    slots = utilisation.slots(window=window, now=now)
    buckets = utilisation.pool_series(window=window, now=now)
    by_team = utilisation.team_series(window=window, now=now)
    teams = {t.id: t for t in Team.objects.filter(id__in=list(by_team)).only("id", "name", "slug")}
    totals = sorted(((tid, sum(v.values())) for tid, v in by_team.items()), key=lambda p: -p[1])
    slot_label, tick = (charts.time_label(f) for f in SLOT_FORMATS[window.key])
    return UtilisationCharts(
        pool=_pool_chart(buckets, slots, window, slot_label, tick),
        teams=charts.stacked_columns(
            slots=slots,
            slot_label=slot_label,
            tick=tick,
            unit="GPU-h",
            title=f"GPU-hours by team, {window.label}, per {window.bucket_minutes} minutes",
            series=[
                charts.Series(_team_name(teams, tid), charts.team_css(tid), by_team[tid]) for tid, _ in totals
            ],
        ),
        totals=charts.horizontal_bars(
            items=[(_team_name(teams, tid), hours, charts.team_css(tid)) for tid, hours in totals],
            unit="GPU-h",
            title=f"GPU-hours by team, {window.label}",
        ),
        team_totals=[(teams.get(tid), hours, charts.team_css(tid)) for tid, hours in totals],
        samples=sum(b.samples for b in buckets),
        expected_samples=int(window.span.total_seconds() // 60),
        busy_gpu_hours=sum(b.busy * b.samples for b in buckets) / 60,
        waste_gpu_hours=sum(b.idle_while_waiting * b.samples for b in buckets) / 60,
        reserved_gpu_hours=sum(b.reserved * b.samples for b in buckets) / 60,
        latest=utilisation.latest(),
    )


def _team_name(teams: Mapping[int, Team], team_id: int) -> str:
    team = teams.get(team_id)
    return team.name if team else f"team {team_id}"


def _pool_chart(buckets, slots, window, slot_label, tick) -> SafeString:
    def series(name: str, css: str, attr: str) -> charts.Series:
        return charts.Series(name, css, {b.minute: getattr(b, attr) for b in buckets})

    return charts.stacked_columns(
        slots=slots, slot_label=slot_label, tick=tick, unit="GPUs",
        title=f"GPUs busy, reserved, idle while jobs wait and idle, {window.label}, mean per {window.bucket_minutes} minutes",
        ceiling=max((b.total for b in buckets), default=0.0) or None,
        series=[
            series("busy", "u-busy", "busy"),
            series("reserved", "u-reserved", "reserved"),
            series("idle while jobs wait", "u-waste", "idle_while_waiting"),
            series("idle", "u-idle", "other_idle"),
        ],
    )  # fmt: skip


# --------------------------------------------------------------------------- jobs


@dataclass(frozen=True)
class JobFilters:
    team: str = ""
    state: str = ""
    end_reason: str = ""
    node: str = ""
    since: str = ""  # YYYY-MM-DD, submitted on or after (UTC)
    until: str = ""  # YYYY-MM-DD, submitted on or before (UTC)

    @classmethod
    def from_query(cls, get: Mapping[str, str]) -> "JobFilters":
        state, reason = get.get("state", ""), get.get("end_reason", "")
        return cls(
            team=get.get("team", "")[:80],
            state=state if state in State.__members__.values() else "",
            end_reason=reason if reason in EndReason.__members__.values() else "",
            node=get.get("node", "").strip()[:63],
            since=_valid_day(get.get("since", "")),
            until=_valid_day(get.get("until", "")),
        )

    @staticmethod
    def choices() -> dict:
        return {"states": [s.value for s in State], "end_reasons": [r.value for r in EndReason]}

    def apply(self, jobs: QuerySet) -> QuerySet:
        if self.team:
            jobs = jobs.filter(team__slug=self.team)
        if self.state:
            jobs = jobs.filter(state=self.state)
        if self.end_reason:
            jobs = jobs.filter(end_reason=self.end_reason)
        if self.node:
            # A subquery, not a join: a job with several allocations on the node is listed once.
            jobs = jobs.filter(id__in=Allocation.objects.filter(node__name=self.node).values("job_id"))
        if self.since:
            jobs = jobs.filter(submitted_at__gte=_day_start(self.since))
        if self.until and (end := _day_end(self.until)):
            jobs = jobs.filter(submitted_at__lt=end)
        return jobs

    @property
    def query(self) -> str:
        return _query(asdict(self))


def _valid_day(raw: str) -> str:
    """``raw`` if it is a real YYYY-MM-DD date, else "" (a malformed filter is ignored, not an error)."""
    try:
        return raw if parse_date(raw) else ""
    except ValueError:
        return ""


def _day_start(day: str) -> datetime:
    return datetime.combine(parse_date(day), time(0), tzinfo=UTC)


def _day_end(day: str) -> datetime | None:
    """The instant after ``day``; None for the last day a date can name (9999-12-31), which no job
    reaches: there is no next day to stop before, and no bound is needed."""
    start = parse_date(day)
    return None if start == date.max else _day_start(day) + timedelta(days=1)


def all_jobs() -> QuerySet:
    jobs = Job.objects.select_related("team").only(*LIST_FIELDS).order_by("-submitted_at", "-id")
    return jobs_selectors.with_canceller(jobs)


def attach_nodes(page: Iterable[Job]) -> None:
    """Sets ``job.nodes`` on each listed job: the nodes it ran on, any attempt (one query for the page)."""
    jobs = list(page)
    names: dict[int, set[str]] = defaultdict(set)
    rows = Allocation.objects.filter(job_id__in=[j.id for j in jobs]).values_list("job_id", "node__name")
    for job_id, node in rows:
        names[job_id].add(node)
    for job in jobs:
        job.nodes = ", ".join(sorted(names[job.id]))


def job_action_allowed(job: Job, action: str) -> bool:
    """Cancel: a live job not already cancelling, its process not ended (see Job.cancellable). Requeue: any job
    not holding GPUs (see services.requeue_job)."""
    if action == "cancel":
        return job.cancellable and job.cancel_requested_at is None
    return job.state not in HOLDS_COMPUTE


def submitter_gone(job: Job) -> str:
    """Why the job's submitter may no longer act for its team ('' while they may), shown before a requeue: the copy
    runs as the operator, who passes the start's check, so the team's secrets would reach code nobody in the
    team vouches for now."""
    try:
        team_secrets.check_submitter(team_id=job.team_id, user_id=job.submitted_by_id)
    except team_secrets.SubmitterGone as exc:
        return str(exc)
    return ""


@dataclass(frozen=True)
class JobOnNode:
    job: Job
    outcome: str


def jobs_on_node(node: Node) -> list[JobOnNode]:
    """Jobs holding GPUs on the node, and what a node loss would do to each (as jobs.rental does it)."""
    held = Allocation.objects.filter(node=node, released_at__isnull=True)
    ran_jobs = rental.attempts_that_ran(held.values("job_id"))
    jobs = Job.objects.filter(id__in=held.values("job_id")).select_related("team")
    return [JobOnNode(job, _loss_outcome(job, started=job.id in ran_jobs)) for job in jobs.only(*LIST_FIELDS)]


def _loss_outcome(job: Job, *, started: bool) -> str:
    if not started:
        return "released and requeued: its process has not started here, so no attempt is spent"
    lost, limit = job.lost_attempts + 1, settings.E31_MAX_ATTEMPTS
    if rental.requeues_after_loss(job):
        resumes = " from its checkpoint" if job.checkpoints else ""
        return f"released and requeued{resumes} (lost attempt {lost} of {limit})"
    if job.requeue or job.checkpoints:
        return f"released and ended (node_lost): it has lost all {limit} attempts it may"
    return "released and ended (node_lost): its declaration does not allow a requeue"


# --------------------------------------------------------------------------- teams


@dataclass(frozen=True)
class TeamRow:
    team: Team
    members: int
    busy_gpus: int
    waiting_jobs: int
    fairshare_gpu_hours: float  # decayed usage the scheduler ranks by
    gpu_hours_30d: float  # from utilisation samples


def team_rows(*, now: datetime) -> list[TeamRow]:
    """Every team with its figures, in five queries."""
    teams = Team.objects.annotate(members=Count("memberships")).order_by("name")
    usage = {u.team_id: u.decayed(now) / 3600 for u in TeamUsage.objects.all()}
    busy = _busy_by_team()
    waiting = dict(
        Job.objects.filter(state__in=BEFORE_RENT)
        .values("team_id")
        .annotate(n=Count("id"))
        .values_list("team_id", "n")
    )
    since = utilisation.minute_of(now - timedelta(days=30))
    recent = TeamBusySample.objects.filter(minute__gte=since).values("team_id").annotate(m=Sum("busy_gpus"))
    hours = {r["team_id"]: r["m"] / 60 for r in recent}
    return [
        TeamRow(
            t, t.members, busy.get(t.id, 0), waiting.get(t.id, 0), usage.get(t.id, 0.0), hours.get(t.id, 0.0)
        )
        for t in teams
    ]


def _busy_by_team(team_id: int | None = None) -> dict[int, int]:
    held = GpuHold.objects.filter(active=True)
    if team_id is not None:
        held = held.filter(allocation__job__team_id=team_id)
    rows = held.values("allocation__job__team_id").annotate(n=Count("id"))
    return {r["allocation__job__team_id"]: r["n"] for r in rows}


def team_page(*, team: Team, now: datetime) -> dict:
    usage = TeamUsage.objects.filter(team=team).first()
    return {
        "team": team,
        "members": team.memberships.select_related("user").order_by("user__username"),
        "projection": metering_selectors.projection(team=team, extra_gpu_hours=0.0, now=now),
        "busy_gpus": _busy_by_team(team.id).get(team.id, 0),
        "waiting_jobs": Job.objects.filter(team=team, state__in=BEFORE_RENT).count(),
        "fairshare_gpu_hours": usage.decayed(now) / 3600 if usage else 0.0,
        "log_bytes": TeamLogBytes.objects.filter(team=team).values_list("bytes", flat=True).first() or 0,
        "log_budget": settings.E31_TEAM_LOG_BYTES,
        "log_keep_days": settings.E31_LOG_KEEP_DAYS,
        "audit": AuditEntry.objects.filter(target=f"team:{team.slug}")[:10],
    }


# --------------------------------------------------------------------------- audit


@dataclass(frozen=True)
class AuditFilters:
    action: str = ""
    actor: str = ""
    target: str = ""

    @classmethod
    def from_query(cls, get: Mapping[str, str]) -> "AuditFilters":
        return cls(get.get("action", "")[:40], get.get("actor", "")[:150], get.get("target", "")[:200])

    def apply(self, entries: QuerySet) -> QuerySet:
        if self.action:
            entries = entries.filter(action__startswith=self.action)
        if self.actor:
            entries = entries.filter(actor=self.actor)
        if self.target:
            entries = entries.filter(target=self.target)
        return entries

    @property
    def query(self) -> str:
        return _query(asdict(self))
