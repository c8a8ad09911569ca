"""What the job pages show, computed from rows: timeline steps, GPU-time so far, live flags."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.core.paginator import Paginator

from jobs import logs, selectors
from jobs.lifecycle import BEFORE_RENT, HOLDS_COMPUTE, STEPS, EndReason, State
from jobs.models import Dependency, Job
from jobs.units import format_size

LIST_FIELDS = (
    "id", "name", "state", "end_reason", "gpus", "hours", "submitted_at", "state_changed_at",
    "estimated_start", "pending_reason", "team__name", "exit_code", "cancel_requested_at",
    "array_id", "array_index", "array__name", "array__spec", "array__size", "array__max_running",
    "attempt", "checkpoint_signal", "checkpoint_held_bytes",  # a pausable job between attempts reads "paused"
)  # fmt: skip


@dataclass(frozen=True)
class Step:
    label: str
    state: str
    began_at: datetime | None
    took: timedelta | None
    status: str  # "done", "current", "todo", "skipped"


def count_array_tasks(page, *, folded: bool) -> None:
    """Gives each array's one row, when the list folds arrays, its tasks' states, one query per page."""
    states = selectors.array_outcomes({job.array_id for job in page if job.array_id}) if folded else {}
    for job in page:
        job.task_states = states.get(job.array_id, {}) if job.array_id else {}


# The badge's colour class for each way a job can end; any reason not named here is a failure.
OUTCOME_TONES = {EndReason.SUCCEEDED: "ok", EndReason.CANCELLED: "muted", EndReason.TIMED_OUT: "warn"}


def outcome(job: Job) -> tuple[str, str]:
    """The job's badge, in words, and its colour class: the state while it lives, how it ended once it
    has ("failed exit 3", "timed out after 0.5 h", "cancelled by alice"), never a bare "released"; an array's one
    row, its tasks' (``count_array_tasks``)."""
    if getattr(job, "task_states", None):
        return array_outcome(job.task_states)
    if job.is_alive:
        return ("cancelling" if job.cancel_requested_at else paused(job) or job.state), f"state-{job.state}"
    reason = job.end_reason
    if reason == EndReason.FAILED and job.exit_code is not None:
        words = f"failed exit {job.exit_code}"
    elif reason == EndReason.TIMED_OUT:
        words = f"timed out after {job.hours:.2f}".rstrip("0").rstrip(".") + " h"
    elif reason == EndReason.CANCELLED and getattr(job, "cancelled_by", ""):
        words = f"cancelled by {job.cancelled_by}"
    else:
        words = (reason or job.state).replace("_", " ")
    return words, OUTCOME_TONES.get(reason, "bad")


def array_outcome(task_states: dict[str, int]) -> tuple[str, str]:
    """An array's badge: how many of its tasks still live, else how they ended: "succeeded" when all did alike,
    else the count of its worst outcome ("4 of 6 cancelled", "1 of 6 failed")."""
    total = sum(task_states.values())
    live = {state: n for state, n in task_states.items() if state in selectors.ALIVE_STATES}
    if live:
        return f"{sum(live.values())} of {total} live", f"state-{next(iter(live))}"
    tones = {words: OUTCOME_TONES.get(words.replace(" ", "_"), "bad") for words in task_states}
    if len(tones) == 1:
        return next(iter(tones.items()))
    worst = max(tones, key=lambda words: ("ok", "muted", "warn", "bad").index(tones[words]))
    return f"{task_states[worst]} of {total} {worst}", tones[worst]


def any_alive(page) -> bool:
    return any(job.is_alive for job in page)


FILES_PER_PAGE = 50


def job_page(job: Job, *, now: datetime, files_page: str | None = None) -> dict:
    events = list(job.events.all())
    allocations = list(job.allocations.select_related("node").order_by("attempt", "rank"))
    return {
        "job": job,
        # The image stages first and shows as the first input: the same progress, rate and ETA.
        "inputs": [*([job.image_pull] if hasattr(job, "image_pull") else []), *job.inputs.all()],
        "events": events,
        "allocations": allocations,
        "steps": timeline(job, events, now=now),
        "never_ran": never_ran(job, events),
        "log_removed": logs.removed_note(job),
        "gpu_seconds": held_gpu_seconds(allocations, now=now),
        "live": job.is_alive or job.delivery_state == "delivering",
        "output_files": output_files(job, files_page),
        "planned": planned_run(job, allocations, now=now),
        "pipeline": pipeline(job),
        **reruns(job),
    }


def never_ran(job: Job, events) -> bool:
    """Ended without ever running: its empty log will stay empty, and its end reason says why."""
    return not job.is_alive and not any(event.to_state == State.RUNNING for event in events)


# The jobs shown running after one: any number of others may wait for a job (100,000 took 17.7 s to show).
DEPENDENTS_SHOWN = 20


def pipeline(job: Job) -> dict:
    """The jobs this one runs after (and what each must do; at most MAX_PREREQUISITES) and the first
    DEPENDENTS_SHOWN of the jobs that run after it, with how many more do."""
    before = job.prerequisites.select_related("prerequisite").order_by("prerequisite_id")
    after = [d.job for d in job.dependents.select_related("job").order_by("job_id")[: DEPENDENTS_SHOWN + 1]]
    return {
        "before": [(d.prerequisite, "succeed" if d.kind == Dependency.AFTER_OK else "end") for d in before],
        "after": after[:DEPENDENTS_SHOWN],
        "more_after": job.dependents.count() - DEPENDENTS_SHOWN if len(after) > DEPENDENTS_SHOWN else 0,
    }


def planned_run(job: Job, allocations, *, now: datetime) -> selectors.PlannedRun | None:
    """What the scheduler plans this job with, while that still matters (waiting or holding GPUs)."""
    if job.state not in BEFORE_RENT | HOLDS_COMPUTE:
        return None
    current = [a for a in allocations if a.attempt == job.attempt and a.released_at is None]
    started = min((a.rented_at for a in current), default=None) if job.state in HOLDS_COMPUTE else None
    return selectors.planned_run(team_id=job.team_id, hours=job.hours, started_at=started, now=now)


RERUNS_SHOWN = 20


def reruns(job: Job) -> dict:
    """The latest re-runs of this job, newest first: a page, never every one."""
    rows = list(job.reruns.order_by("-id").only("id", "state")[: RERUNS_SHOWN + 1])
    return {"reruns": rows[:RERUNS_SHOWN], "more_reruns": len(rows) > RERUNS_SHOWN}


def output_files(job: Job, page: str | None):
    """One page of the files the current attempt sealed: a job may have sealed thousands."""
    rows = job.output_files.filter(attempt=job.attempt).order_by("path").only("path", "bytes", "sha256")
    return Paginator(rows, FILES_PER_PAGE).get_page(page)


def timeline(job: Job, events, *, now: datetime) -> list[Step]:
    """The seven steps of the current attempt: when each began, how long it took, where the job is."""
    began: dict[str, datetime] = {}
    finished: dict[str, datetime] = {}  # steps of the first attempt that a requeue does not repeat
    for event in events:
        if event.to_state == State.QUEUED and event.from_state in HOLDS_COMPUTE:
            for kept, until in ((State.SUBMITTED, State.STAGING), (State.STAGING, State.QUEUED)):
                if kept in began and until in began:
                    finished.setdefault(kept, began[until])
            began = {k: v for k, v in began.items() if k in (State.SUBMITTED, State.STAGING, State.QUEUED)}
            began[State.QUEUED] = event.at  # a requeue starts a new attempt's wait
        began.setdefault(event.to_state, event.at)
    ended_at = began.get(State.ENDED) or began.get(State.RELEASED)
    steps = []
    for position, (label, state) in enumerate(STEPS):
        start = began.get(state)
        later = [began[s] for _, s in STEPS[position + 1 :] if s in began]
        end = finished.get(state) or (
            min(later) if later else (ended_at if ended_at and ended_at != start else None)
        )
        if start is None:
            status = "todo" if job.is_alive else "never"
        else:
            # A released job is over: its last step is done, not in progress.
            status = "current" if state == job.state and job.is_alive else "done"
        took = ((end or now) - start) if start and state != State.RELEASED else None
        steps.append(
            Step(paused(job) or label if state == State.QUEUED else label, state, start, took, status)
        )
    return steps


def paused(job: Job) -> str:
    """A pausable job between attempts: "paused (checkpoint 1.2 GB)"; '' for any other job or state."""
    if not (job.checkpoints and job.state == State.QUEUED and job.attempt >= 1):
        return ""
    held = job.checkpoint_held_bytes or 0
    return f"paused (checkpoint {format_size(held)})" if held else "paused (no checkpoint kept)"


def held_gpu_seconds(allocations, *, now: datetime) -> float:
    """GPU-seconds held so far, counting running allocations up to now (the ledger is exact; this is live)."""
    return sum(((a.released_at or now) - a.rented_at).total_seconds() * a.gpu_count for a in allocations)
