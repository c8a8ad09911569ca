"""Writes what a scheduler pass decided: each waiting job's estimated start, reason and priority,
and the pass's own figures on the scheduler's row (shown on the operators' queue page).
"""

from datetime import datetime, timedelta

from jobs import dispatch
from jobs.lifecycle import BEFORE_RENT
from jobs.models import Job, SchedulerState
from jobs.scheduling import types


def store_estimates(plan: types.Plan, *, now: datetime) -> None:
    """Writes each waiting job's estimated start, reason and priority (only jobs not yet rented)."""
    waiting = Job.objects.filter(id__in=list(plan.estimates), state__in=BEFORE_RENT).only("id")
    rows = []
    for job in waiting:
        estimate = plan.estimates[job.id]
        job.estimated_start = _at(estimate.start_at, now)
        job.pending_reason = estimate.reason[:300]
        job.priority_detail = plan.priority.get(job.id, {})
        job.priority = job.priority_detail.get("total")
        rows.append(job)
    # Still waiting at the write, too: a job that ended since the read keeps its cleared reason.
    Job.objects.filter(state__in=BEFORE_RENT).bulk_update(
        rows, ["estimated_start", "pending_reason", "priority", "priority_detail"], batch_size=1000
    )


def _at(ts: float | None, now: datetime) -> datetime | None:
    if ts is None:
        return None
    return now + timedelta(seconds=max(0.0, ts - now.timestamp()))


def record_pass(*, started: int, elapsed_ms: float, now: datetime) -> None:
    """The last pass's time, duration and starts."""
    SchedulerState.objects.filter(id=dispatch.state_row().id).update(
        last_pass_at=now, last_pass_ms=elapsed_ms, last_pass_started=started
    )
