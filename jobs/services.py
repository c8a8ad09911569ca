"""Job intake and lifecycle writers. The only code that changes a job's state.

Every transition is a conditional UPDATE (``WHERE id=? AND state=?``) plus an event row, in
one transaction; a second worker, or a redelivered task, finds the state already moved and
gets False back. Work for other processes is enqueued after commit, carrying ids only.
"""

from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Sum

from jobs import declaration, dependencies, dispatch, rental, sharing, signals
from jobs.lifecycle import BEFORE_RENT, HOLDS_COMPUTE, EndReason, State
from jobs.models import DataInput, Job, JobEvent, Node
from jobs.transitions import transition


def pool_limits(*, team=None) -> declaration.Limits:
    """What a declaration is checked against: the GPUs, memory and CPUs of every node not down, the
    configured roots, and for a chosen team its prefix of each root and the dataset folders shared with it."""
    pool = Node.objects.exclude(state=Node.NodeState.DOWN).aggregate(
        gpus=Sum("gpus"), memory=Sum("memory_bytes"), cpus=Sum("cpus")
    )
    return declaration.Limits(
        pool_gpus=pool["gpus"] or 0,
        pool_memory=pool["memory"] or 0,
        pool_cpus=pool["cpus"] or 0,
        max_hours=settings.E31_MAX_JOB_HOURS,
        max_output_bytes=settings.E31_MAX_OUTPUT_BYTES,
        data_roots=settings.E31_DATA_ROOTS,
        output_roots=settings.E31_OUTPUT_ROOTS,
        team=team.slug if team is not None else None,
        shared=sharing.shared_with(team.slug) if team is not None else (),
    )


@transaction.atomic
def submit_job(
    *, team, user, spec: declaration.Declaration, now: datetime, rerun_of: Job | None = None
) -> Job:
    """Stores a validated declaration as a submitted job and rings for staging after commit.

    A job that would take its team past an enforced monthly budget is refused like any invalid
    field; past a budget that only warns, it is stored and ``job.budget_note`` says so. A re-run
    links to its source, which must be a job of the same team.
    """
    if rerun_of is not None and rerun_of.team_id != team.id:
        raise declaration.DeclarationInvalid([("rerun_of", "a re-run belongs to its source job's team")])
    budget = signals.check_budget(team=team, gpu_hours=spec.gpus * spec.hours, now=now)
    if budget and budget.refused:
        raise declaration.DeclarationInvalid([("request.hours", budget.message)])
    dependencies.check_prerequisites(team=team, after_ok=spec.after_ok, after_any=spec.after_any)
    job = Job.objects.create(
        team=team, submitted_by=user, name=spec.name, state=State.SUBMITTED,
        submitted_at=now, state_changed_at=now,
        argv=spec.argv, env=spec.env, image=spec.image, workdir=spec.workdir,
        gpus=spec.gpus, gpu_model=spec.gpu_model, hours=spec.hours, min_gpus=spec.min_gpus, max_gpus=spec.max_gpus,
        preemptible=spec.preemptible, requeue=spec.requeue, memory_bytes=spec.memory_bytes, cpus=spec.cpus,
        output_uri=spec.output_uri, output_bytes=spec.output_bytes, rerun_of=rerun_of,
    )  # fmt: skip
    DataInput.objects.bulk_create(
        DataInput(job=job, position=i, name=d.name, uri=d.uri, bytes=d.bytes, sha256=d.sha256)
        for i, d in enumerate(spec.data)
    )
    dependencies.record(job_ids=[job.id], after_ok=spec.after_ok, after_any=spec.after_any)
    JobEvent.objects.create(job=job, to_state=State.SUBMITTED, at=now, actor=_actor(user), reason="submitted")
    dispatch.stage_job(job.id)
    dispatch.request_scheduler_pass()  # an estimated start for the team at once, even while staging
    job.budget_note = budget.message if budget and budget.would_exceed else ""
    return job


@transaction.atomic
def cancel_job(*, job_id: int, user, now: datetime) -> bool:
    """Cancels a live job. Before RENT it ends unmetered; after, the node agent stops it and releases."""
    job = Job.objects.select_for_update().filter(id=job_id).first()
    if job is None or not job.is_alive:
        return False
    if job.state in BEFORE_RENT:
        ended = transition(
            job_id=job_id, source=job.state, target=State.ENDED, now=now, actor=_actor(user),
            end_reason=EndReason.CANCELLED, reason=f"cancelled by {_actor(user)}", pending_reason="",
        )  # fmt: skip
        if ended:
            dispatch.request_scheduler_pass()
        return ended
    if job.state == State.RENTED and not job.allocations.filter(started_at__isnull=False).exists():
        # GPUs are held but no process started yet: nothing to stop, so release now.
        return rental.release_job(job_id=job_id, end_reason=EndReason.CANCELLED, now=now, actor=_actor(user),
                                  detail=f"cancelled by {_actor(user)} before its process started")  # fmt: skip
    marked = Job.objects.filter(id=job_id, cancel_requested_at__isnull=True, state__in=HOLDS_COMPUTE).update(
        cancel_requested_at=now
    )
    if marked:
        JobEvent.objects.create(
            job_id=job_id, from_state=job.state, to_state=job.state, at=now,
            reason=f"cancel requested by {_actor(user)}", actor=_actor(user), attempt=job.attempt,
        )  # fmt: skip
        # The node agent watching this attempt polls the flag every second and stops the process group.
    return bool(marked)


def _actor(user) -> str:
    return getattr(user, "username", "") or "system"
