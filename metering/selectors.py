"""Reads shared by the ledger pages, the operators' pages, the submit form and the API.

Monthly GPU-hour budgets: what a team has used, holds and has queued, and whether a job fits.
Usage comes from the ledger (closed periods) plus the unclosed part of held allocations up to
now, so the figure a team sees agrees with the ledger to the microsecond once accrual runs.
A running job also counts what it may still use this month, up to its declared limit, as a queued
one counts all of it: otherwise a job's start would free the budget it is about to spend.

A job's meter: its ledger rows grouped by allocation, for the job page. Nothing here writes.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import groupby

from django.db import connection, transaction
from django.db.models import F, FloatField, Max, OuterRef, Subquery, Sum

from accounts.models import Team
from common.ledger_locks import team_ledger_held
from jobs.lifecycle import BEFORE_RENT
from jobs.models import Allocation, Job
from metering.models import LedgerDay, MeterEntry
from metering.periods import MICROS_PER_HOUR, micros, month_start, next_month, utc


@dataclass(frozen=True)
class Projection:
    """A team's GPU-hours this UTC month, with ``extra_gpu_hours`` added, against its budget."""

    team: str
    used_gpu_hours: float  # closed ledger rows this month, adjustments included
    running_gpu_hours: float  # held allocations, from their last closed period up to now
    committed_gpu_hours: float  # held allocations, from now to their job's limit (this month's share)
    queued_gpu_hours: float  # jobs not yet rented, at gpus x hours
    extra_gpu_hours: float  # the job being asked about
    budget_gpu_hours: float | None
    enforced: bool
    would_exceed: bool
    message: str

    @property
    def total_gpu_hours(self) -> float:
        return (
            self.used_gpu_hours
            + self.running_gpu_hours
            + self.committed_gpu_hours
            + self.queued_gpu_hours
            + self.extra_gpu_hours
        )

    @property
    def left_gpu_hours(self) -> float | None:
        """What the budget leaves once all of this is counted (negative past it); None without a budget."""
        return None if self.budget_gpu_hours is None else self.budget_gpu_hours - self.total_gpu_hours

    @property
    def refused(self) -> bool:
        """Over an enforced budget: the caller refuses the job. Over an unenforced one it only warns."""
        return self.would_exceed and self.enforced


def projection(*, team: Team, extra_gpu_hours: float, now: datetime) -> Projection:
    """Used + running + queued + extra against the team's monthly budget; call it before the job is stored."""
    start = month_start(utc(now))
    # "Used" ends where "running" begins (each held allocation's last closed period), so both are
    # read in one snapshot: an accrual committing between two reads would count its hours in neither.
    with _one_snapshot(team.id):
        used = _used_micros(team=team, start=start) / MICROS_PER_HOUR
        running, committed = (m / MICROS_PER_HOUR for m in _held_micros(team=team, start=start, now=now))
        queued = _queued_gpu_hours(team=team)
    budget = None if team.monthly_budget_gpu_hours is None else float(team.monthly_budget_gpu_hours)
    figures = (used, running, committed, queued, extra_gpu_hours)
    exceed = budget is not None and sum(figures) > budget
    message = _message(team, *figures, budget, exceed=exceed)
    return Projection(team.slug, *figures, budget, team.budget_enforced, exceed, message)


@contextmanager
def _one_snapshot(team_id: int) -> Iterator[None]:
    """One consistent view of the team's meter for every read inside: REPEATABLE READ when this is the
    outermost transaction on PostgreSQL; nested (a submission weighing its budget), the team's ledger lock
    while they run, so that no accrual or RELEASE commits between them (SQLite has one writer).
    No savepoint: these are reads, with nothing of their own to roll back."""
    outermost = not connection.in_atomic_block
    with transaction.atomic(savepoint=False):
        if not outermost:
            with team_ledger_held(team_id):
                yield
            return
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


def _used_micros(*, team: Team, start: datetime) -> int:
    days = LedgerDay.objects.filter(team=team, day__gte=start.date(), day__lt=next_month(start).date())
    return int(days.aggregate(total=Sum("gpu_micros"))["total"] or 0)


def _held_micros(*, team: Team, start: datetime, now: datetime) -> tuple[int, int]:
    """GPU-microseconds of the team's held allocations this month: (run and not yet closed, still to come).

    Run: this month's share of what accrual has not closed yet; the rest is in the ledger. Still to come:
    from now to the job's limit, which runs from the attempt's first start (``jobs.rental``), from now for
    an attempt not started yet, up to the month's end; none for a part whose process has exited (it is
    being sealed and released).
    """
    last_end = (
        MeterEntry.objects.filter(allocation=OuterRef("pk"))
        .exclude(kind=MeterEntry.Kind.ADJUSTMENT)
        .order_by("-period_start")
        .values("period_end")[:1]
    )
    first_start = (
        Allocation.objects.filter(job=OuterRef("job"), attempt=OuterRef("attempt"))
        .order_by(F("started_at").asc(nulls_last=True))
        .values("started_at")[:1]
    )
    held = (
        Allocation.objects.filter(job__team=team, released_at__isnull=True)
        .annotate(last_end=Subquery(last_end), first_start=Subquery(first_start))
        .values_list("rented_at", "last_end", "first_start", "finished_at", "job__hours", "gpu_indices")
    )
    month_end = next_month(start)
    run = to_come = 0
    for rented_at, last_end, started, finished, hours, indices in held:
        run += len(indices) * max(0, micros(now - max(last_end or rented_at, start)))
        if finished is None:
            limit = (started or now) + timedelta(hours=hours)
            to_come += len(indices) * max(0, micros(min(limit, month_end) - now))
    return run, to_come


def _queued_gpu_hours(*, team: Team) -> float:
    queued = Job.objects.filter(team=team, state__in=BEFORE_RENT).aggregate(
        total=Sum(F("gpus") * F("hours"), output_field=FloatField())
    )
    return float(queued["total"] or 0.0)


def _message(team: Team, used, running, committed, queued, extra, budget, *, exceed: bool) -> str:
    parts = f"used {_n(used)}, running {_n(running)}"
    parts += f", {_n(committed)} more to the running jobs' limits" if committed else ""
    parts += f", queued {_n(queued)}"
    parts += f", this job {_n(extra)}" if extra else ""
    subject = f"This job would bring team {team.name} to" if extra else f"Team {team.name} is at"
    total = used + running + committed + queued + extra
    if budget is None:
        return (
            f"{subject} {_n(total)} GPU-hour{_s(total)} this month ({parts}); the team has no monthly budget."
        )
    sentence = f"{subject} {_n(total)} of {_n(budget)} GPU-hour{_s(budget)} this month ({parts})."
    if not exceed:
        return sentence
    if team.budget_enforced:
        verdict = "so this job is refused" if extra else "so new jobs are refused"
        return f"{sentence} The budget is enforced, {verdict}."
    return f"{sentence} The budget is not enforced: this is a warning only."


def _s(hours: float) -> str:
    """The plural ending for an amount as ``_n`` shows it: '1 GPU-hour', '1.5 GPU-hours'."""
    return "" if _n(hours) == "1" else "s"


def _n(hours: float) -> str:
    """412, 12.5: GPU-hours to one decimal, without a trailing .0."""
    return f"{hours:,.1f}".removesuffix(".0")


def ledger_version(team: Team | None) -> int:
    """A number that changes whenever the team's ledger (every team's: ``None``) gains a row: how many rows the
    team's day summaries count, or the latest row's id. A page compares it to redraw what it showed."""
    if team is None:
        return MeterEntry.objects.aggregate(latest=Max("id"))["latest"] or 0
    return LedgerDay.objects.filter(team=team).aggregate(rows=Sum("rows"))["rows"] or 0


def adjustments(*, allocation_id: int) -> list[MeterEntry]:
    """The allocation's adjustment rows, oldest first, with their authors."""
    rows = MeterEntry.objects.filter(allocation_id=allocation_id, kind=MeterEntry.Kind.ADJUSTMENT)
    return list(rows.select_related("created_by").order_by("created_at", "period_start"))


def metered_until(*, allocation_ids: list[int]) -> datetime | None:
    """The end of the latest period metered for these allocations (adjustments aside); None: none yet."""
    metered = MeterEntry.objects.filter(allocation_id__in=allocation_ids).exclude(
        kind=MeterEntry.Kind.ADJUSTMENT
    )
    return metered.aggregate(until=Max("period_end"))["until"]


# --------------------------------------------------------------------------- a job's meter


@dataclass(frozen=True)
class MeterPart:
    """One allocation's meter: when it started and stopped, why, and its rows."""

    allocation: Allocation
    entries: list[MeterEntry]
    open_micros: int = 0  # GPU-time held since its last closed row: in the ledger once that period closes

    @property
    def gpu_micros(self) -> int:
        return sum(e.gpus * e.microseconds for e in self.entries)

    @property
    def heartbeat_gap(self) -> timedelta | None:
        return silent_gap(self.allocation)

    @property
    def adjusted(self) -> bool:
        return any(e.kind == MeterEntry.Kind.ADJUSTMENT for e in self.entries)


def silent_gap(allocation: Allocation) -> timedelta | None:
    """How long the allocation held its GPUs after its node's last heartbeat, up to RELEASE.

    The gap starts no earlier than RENT: a node may go silent before a job is placed on it (it is
    still within its timeout), and GPU-time from before RENT was never metered, so never credited.
    """
    heartbeat, released = allocation.last_heartbeat_at_release, allocation.released_at
    if heartbeat and released:
        return released - max(heartbeat, allocation.rented_at)
    return None


def job_meter(job: Job, *, now: datetime) -> list[MeterPart]:
    """The job's ledger rows grouped by allocation (attempt, node), oldest attempt first, each with the
    GPU-time of its open period up to ``now`` while it still holds GPUs."""
    allocations = list(job.allocations.select_related("node").order_by("attempt", "rank", "id"))
    rows = MeterEntry.objects.filter(job=job).order_by("allocation_id", "period_start", "id")
    by_allocation = {key: list(group) for key, group in groupby(rows, key=lambda e: e.allocation_id)}
    parts = []
    for a in allocations:
        entries = by_allocation.get(a.id, [])
        parts.append(MeterPart(a, entries, _open_micros(a, entries, now=now)))
    return parts


def _open_micros(allocation: Allocation, entries: list[MeterEntry], *, now: datetime) -> int:
    if allocation.released_at is not None:
        return 0
    closed = [e.period_end for e in entries if e.kind != MeterEntry.Kind.ADJUSTMENT]
    since = max(closed, default=allocation.rented_at)
    return max(micros(now - since), 0) * allocation.gpu_count
