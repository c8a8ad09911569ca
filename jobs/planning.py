"""Writes what a scheduler pass decided: each waiting job's estimated start, reason and priority,
and the pass's own figures on the scheduler's row (shown on the operators' queue page).
"""

from datetime import datetime, timedelta

from django.db import transaction

from jobs import dispatch
from jobs.lifecycle import BEFORE_RENT
from jobs.models import Job, SchedulerState
from jobs.scheduling import types

ESTIMATE = ("estimated_start", "pending_reason")
PRIORITY = ("priority", "priority_detail")


@transaction.atomic
def store_estimates(plan: types.Plan, *, now: datetime) -> None:
    """Writes each waiting job's estimated start, reason and priority (only jobs not yet rented), and of each only
    what changed: a job's priority moves on every pass (it ages), its estimate and reason seldom do, and each
    column written costs the write a term per job (``bulk_update``'s CASE), which dominated a pass's time.

    A job another transaction holds (a team cancelling an array) is left to the next pass, not waited for: the
    pass holds the pool's one pass lock, and every team's starts waited with it (9.5 s, against 0.9 s)."""
    waiting = (
        Job.objects.filter(id__in=list(plan.estimates), state__in=BEFORE_RENT)
        .select_for_update(skip_locked=True, no_key=True)
        .only("id", *ESTIMATE, *PRIORITY)
    )
    moved: list[Job] = []  # its estimate or reason changed: every column written
    aged: list[Job] = []  # only its priority changed
    for job in waiting:
        estimate, detail = plan.estimates[job.id], plan.priority.get(job.id, {})
        stored = (job.estimated_start, job.pending_reason, job.priority, job.priority_detail)
        job.estimated_start = _at(estimate.start_at, now)
        job.pending_reason = estimate.reason[:300]
        job.priority_detail = detail
        job.priority = detail.get("total")
        if stored[:2] != (job.estimated_start, job.pending_reason):
            moved.append(job)
        elif stored[2:] != (job.priority, job.priority_detail):
            aged.append(job)
    # Still waiting at the write, too: a job that ended since the read keeps its cleared reason.
    still_waiting = Job.objects.filter(state__in=BEFORE_RENT)
    if moved:
        still_waiting.bulk_update(moved, [*ESTIMATE, *PRIORITY], batch_size=1000)
    if aged:
        still_waiting.bulk_update(aged, list(PRIORITY), batch_size=1000)


def _at(ts: float | None, now: datetime) -> datetime | None:
    if ts is None:
        return None
    return now + timedelta(seconds=max(0.0, ts - now.timestamp()))


def record_pass(*, started: int, elapsed_ms: float, now: datetime) -> None:
    """The last pass's time, duration and starts."""
    SchedulerState.objects.filter(id=dispatch.state_row().id).update(
        last_pass_at=now, last_pass_ms=elapsed_ms, last_pass_started=started
    )
