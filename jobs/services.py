"""Job intake and lifecycle writers. The only code that changes a job's state.

Every transition is a conditional UPDATE (``WHERE id=? AND state=?``) plus an event row, in
one transaction; a second worker, or a redelivered task, finds the state already moved and
gets False back. Work for other processes is enqueued after commit, carrying ids only.
"""

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q, Sum

from accounts import team_secrets
from accounts.models import Team
from jobs import cache_fill, declaration, dependencies, dispatch, rental, sharing, signals
from jobs.lifecycle import ALIVE, BEFORE_RENT, HOLDS_COMPUTE, EndReason, State
from jobs.models import DataInput, Dependency, Job, JobArray, JobEvent, Node
from jobs.transitions import transition
from jobs.units import format_size


def pool_limits(*, team=None) -> declaration.Limits:
    """What a declaration is checked against: the GPUs, memory, CPUs and GPU models of every node not down, the
    configured roots, and for a chosen team its prefix of each root, the dataset folders shared with it and those
    its own folders hold but are shared with other teams only."""
    live = Node.objects.exclude(state=Node.NodeState.DOWN)
    pool = live.aggregate(gpus=Sum("gpus"), memory=Sum("memory_bytes"), cpus=Sum("cpus"))
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
        withheld=sharing.withheld(team.slug) if team is not None else (),
        max_array=settings.E31_MAX_ARRAY,
        max_checkpoint_bytes=settings.E31_MAX_CHECKPOINT_BYTES,
        secrets=frozenset(team_secrets.names(team)) if team is not None else None,
        s3_roots=settings.E31_S3_ROOTS,
        gpu_models=frozenset(live.values_list("gpu_model", flat=True).distinct()),
        nodes=tuple(live.values_list("gpus", "memory_bytes", "cpus")),
    )


def _checkpoint(spec: declaration.Declaration) -> dict:
    c = spec.checkpoint
    return (
        {"checkpoint_signal": c.signal, "checkpoint_grace_s": c.grace_s, "checkpoint_bytes": c.bytes}
        if c
        else {}
    )


def declared_fields(spec: declaration.Declaration) -> dict:
    """The job's columns a declaration sets, as submitting stores them: what the scheduler plans a waiting job
    by (``snapshot.pending_job``), and what the submit form's preview plans its draft by, so the two agree."""
    return {
        "name": spec.name, "argv": spec.argv, "env": spec.env, "image": spec.image, "workdir": spec.workdir,
        "secrets": spec.secrets, "gpus": spec.gpus, "gpu_model": spec.gpu_model, "hours": spec.hours,
        "min_gpus": spec.min_gpus, "max_gpus": spec.max_gpus, "preemptible": spec.preemptible,
        "requeue": spec.requeue, "memory_bytes": spec.memory_bytes, "cpus": spec.cpus,
        "output_uri": spec.output_uri, "output_bytes": spec.output_bytes, **_checkpoint(spec),
    }  # fmt: skip


@transaction.atomic
def submit_job(
    *, team, user, spec: declaration.Declaration, now: datetime, rerun_of: Job | None = None
) -> Job:
    """Stores a validated declaration as a submitted job (an array: one job per index, its first task
    returned) and rings for staging after commit.

    A job that would take its team past E31_MAX_WAITING_PER_TEAM waiting tasks, or past an enforced monthly
    budget, is refused like any invalid field; past a budget that only warns, it is stored and
    ``job.budget_note`` says so. A re-run links to its source, which must be a job of the same team.
    """
    if rerun_of is not None and rerun_of.team_id != team.id:
        raise declaration.DeclarationInvalid([("rerun_of", "a re-run belongs to its source job's team")])
    tasks = len(spec.array.indices) if spec.array else 1
    # Two submissions at once each weigh the waiting cap and the budget after the other's jobs are stored.
    Team.objects.select_for_update(no_key=True).filter(id=team.id).first()
    _check_waiting_cap(team=team, tasks=tasks, prerequisites=tasks * len({*spec.after_ok, *spec.after_any}))
    _check_hourly_submissions(team=team, tasks=tasks, now=now)
    if spec.checkpoint:
        _check_checkpoint_quota(team=team, tasks=tasks, each=spec.checkpoint.bytes)
    budget = signals.check_budget(team=team, gpu_hours=spec.gpus * spec.hours * tasks, now=now)
    if budget and budget.refused:
        raise declaration.DeclarationInvalid([("request.hours", budget.message)])
    dependencies.check_prerequisites(team=team, after_ok=spec.after_ok, after_any=spec.after_any)
    array = _array(team=team, spec=spec, now=now, rerun_of=rerun_of)
    indices = spec.array.indices if spec.array else (None,)
    jobs = Job.objects.bulk_create(
        Job(
            team=team, submitted_by=user, state=State.SUBMITTED, submitted_at=now, state_changed_at=now,
            array=array, array_index=index, rerun_of=rerun_of, **declared_fields(spec),
        )
        for index in indices
    )  # fmt: skip
    DataInput.objects.bulk_create(
        DataInput(job=job, position=i, name=d.name, uri=d.uri, bytes=d.bytes, sha256=d.sha256)
        for job in jobs
        for i, d in enumerate(spec.data)
    )
    dependencies.record(job_ids=[job.id for job in jobs], after_ok=spec.after_ok, after_any=spec.after_any)
    reason = f"submitted as task {{}} of array {array.id} [{array.spec}]" if array else "submitted"
    JobEvent.objects.bulk_create(
        JobEvent(
            job=job,
            to_state=State.SUBMITTED,
            at=now,
            actor=_actor(user),
            reason=reason.format(job.array_index),
        )
        for job in jobs
    )
    held = dependencies.unmet(job.id for job in jobs) if spec.after_ok or spec.after_any else {}
    for job in jobs:
        if job.id not in held:  # else staged once its prerequisites are met: it may read what they write
            dispatch.stage_job(job.id)
    dispatch.request_scheduler_pass()  # an estimated start for the team at once, even while staging
    first = jobs[0]
    first.budget_note = budget.message if budget and budget.would_exceed else ""
    if first.budget_note:
        signals.job_event.send(
            sender=Job, job_id=first.id, event="budget_warning", attempt=0, now=now, detail=first.budget_note
        )
    return first


# Prerequisites of waiting jobs that weigh on a pass as one waiting job does (each pass reads and weighs them all):
# 2,000 waiting tasks of 64 prerequisites each made a pass take 5.0 s, against 1.6 s for 2,000 without.
PREREQUISITES_PER_SLOT = 32


def _check_waiting_cap(*, team, tasks: int, prerequisites: int) -> None:
    """Refuses tasks that would take the team past E31_MAX_WAITING_PER_TEAM waiting (submitted, staging or queued),
    every PREREQUISITES_PER_SLOT of their prerequisites counted as one more: every scheduler pass reads, plans and
    writes each waiting job under the one pass lock, so one team's flood would hold back every start in the pool.
    Called with the team's row locked."""
    cap = settings.E31_MAX_WAITING_PER_TEAM
    waiting = Job.objects.filter(team=team, state__in=BEFORE_RENT)
    held = waiting.count()
    edges = Dependency.objects.filter(job__in=waiting).count()
    if held + tasks + _slots(edges + prerequisites) > cap:
        adds = f"this submission adds {_tasks(tasks)}" + (
            f" and {prerequisites} prerequisites" if prerequisites else ""
        )
        among = f" with {edges} prerequisites among them" if edges else ""
        raise declaration.DeclarationInvalid([(
            "team",
            f"{team.name} has {_tasks(held)} waiting (submitted, staging or queued){among} and {adds}: a team may "
            f"have at most {cap} waiting at once (E31_MAX_WAITING_PER_TEAM), every {PREREQUISITES_PER_SLOT} "
            "prerequisites counted as one more. Wait for some to start, cancel some you no longer need, or ask an "
            "operator to raise the limit.",
        )])  # fmt: skip


def _check_hourly_submissions(*, team, tasks: int, now: datetime) -> None:
    """Refuses tasks that would take the team past E31_MAX_SUBMITTED_PER_TEAM_HOUR submitted in the last hour,
    cancelled ones too: a cancel frees the waiting cap at once, and every job stays on record (its events, its
    inputs), so a token that submitted a 1,000-task array and cancelled it, round after round, grew the database
    without bound. Called with the team's row locked."""
    cap = settings.E31_MAX_SUBMITTED_PER_TEAM_HOUR
    recent = Job.objects.filter(team=team, submitted_at__gt=now - timedelta(hours=1)).count()
    if recent + tasks > cap:
        raise declaration.DeclarationInvalid([(
            "team",
            f"{team.name} submitted {_tasks(recent)} in the last hour and this submission adds {_tasks(tasks)}: a "
            f"team may submit at most {cap:,} an hour, cancelled ones included (E31_MAX_SUBMITTED_PER_TEAM_HOUR). "
            "Submit again later, or ask an operator to raise the limit.",
        )])  # fmt: skip


def _slots(prerequisites: int) -> int:
    return -(-prerequisites // PREREQUISITES_PER_SLOT)


def _tasks(count: int) -> str:
    return f"{count} task{'s' if count != 1 else ''}"


def _check_checkpoint_quota(*, team, tasks: int, each: int) -> None:
    """Refuses checkpoints that would take the team's claims past E31_TEAM_CHECKPOINT_BYTES: a pausable job's
    checkpoint is an image of its declared size, allocated on the checkpoint store at its first start and kept
    until the job ends, so every job not yet ended counts what it declared. Called with the team's row locked."""
    quota = settings.E31_TEAM_CHECKPOINT_BYTES
    live = Job.objects.filter(team=team, state__in=ALIVE, checkpoint_bytes__isnull=False)
    claimed = live.aggregate(total=Sum("checkpoint_bytes"))["total"] or 0
    if claimed + tasks * each > quota:
        adds = f"{tasks} tasks of {format_size(each)} each" if tasks > 1 else format_size(each)
        raise declaration.DeclarationInvalid([(
            "request.checkpoint.bytes",
            f"{team.name}'s jobs not yet ended claim {format_size(claimed)} of checkpoint space and this submission "
            f"adds {adds}: a team's checkpoints together may claim at most {format_size(quota)} "
            "(E31_TEAM_CHECKPOINT_BYTES). Declare less, wait for a pausable job to end, or ask an operator to raise it.",
        )])  # fmt: skip


def _array(*, team, spec: declaration.Declaration, now: datetime, rerun_of: Job | None) -> JobArray | None:
    if spec.array is None:
        return None
    limit_of, limit = _limit_shared_with(spec, rerun_of)
    return JobArray.objects.create(
        team=team, name=spec.name, spec=spec.array.text[:200], size=len(spec.array.indices),
        max_running=limit if limit_of else spec.array.limit, first_index=spec.array.indices[0], submitted_at=now,
        limit_of=limit_of,
    )  # fmt: skip


def _limit_shared_with(
    spec: declaration.Declaration, rerun_of: Job | None
) -> tuple[JobArray | None, int | None]:
    """A single task run again (an operator's requeue, a team's re-run) counts against its array's limit:
    requeued one by one, a "%8" array's failed tasks would otherwise all run at once."""
    if rerun_of is None or rerun_of.array_id is None or len(spec.array.indices) != 1:
        return None, None
    source = JobArray.objects.select_related("limit_of").get(id=rerun_of.array_id)
    origin = source.limit_of or source
    return origin, origin.max_running


# Tasks an array's cancel holds at once: in one transaction, a 1,000-task array's rows stayed locked for the whole
# cancel (10.5 s), and the scheduler's pass, waiting on them, held every team's starts.
CANCEL_BATCH = 100


def cancel_array(*, array_id: int, user, now: datetime) -> int:
    """Cancels every live task of an array, its tasks run again on their own included (each as ``cancel_job``
    would), CANCEL_BATCH tasks a transaction; returns how many. Stopped midway, the batches done stay done and
    asking again cancels the rest."""
    tasks = Job.objects.filter(Q(array_id=array_id) | Q(array__limit_of_id=array_id), state__in=ALIVE)
    live = list(tasks.order_by("id").values_list("id", flat=True))
    cancelled = 0
    for first in range(0, len(live), CANCEL_BATCH):
        batch = live[first : first + CANCEL_BATCH]
        with transaction.atomic():
            rental.lock_for_release(
                batch
            )  # some may be released here: every task's lock first, in the one order
            cancelled += sum(cancel_job(job_id=job_id, user=user, now=now) for job_id in batch)
    return cancelled


@transaction.atomic
def cancel_unstarted_jobs(
    *, submitted_by_id: int, team_id: int | None, why: str, actor, now: datetime
) -> int:
    """Cancels an account's jobs (in one team, or in every team when ``team_id`` is None) that hold no GPUs yet,
    each as ``cancel_job`` would, ``why`` its end detail; returns how many. Its jobs past RENT keep running.

    Called inside a change of the team's members, which holds the team's row: a job row another transaction holds
    (the scheduler renting it at this moment, staging moving it) is skipped, not waited for, as that transaction
    may wait for the team's row in turn (a row it inserts refers to the team). A job skipped so, once placed, gets
    no secrets at its start (the node agent checks its submitter again) and ends there, released with the reason.
    """
    waiting = Job.objects.filter(submitted_by_id=submitted_by_id, state__in=BEFORE_RENT)
    if team_id is not None:
        waiting = waiting.filter(team_id=team_id)
    job_ids = waiting.select_for_update(skip_locked=True).order_by("id").values_list("id", flat=True)
    return _cancel_each(list(job_ids), why=why, actor=actor, now=now)


@transaction.atomic
def cancel_deleted_accounts_jobs(*, submitted_by_id: int, why: str, now: datetime) -> int:
    """Cancels every live job of an account being deleted, in every team, running ones too (asked to stop, never
    requeued after); returns how many. Nobody is left to answer for them, and a job requeued later (its node lost)
    would start with no submitter, as a job the platform made itself, with the team's secrets. A job row another
    transaction holds at this moment (the scheduler placing it) is waited for, not skipped: the deletion's own
    setting of its submitter to NULL waits for that row anyway."""
    live = Job.objects.filter(submitted_by_id=submitted_by_id, state__in=ALIVE)
    job_ids = live.select_for_update().order_by("id").values_list("id", flat=True)
    # Sealing ones too: nothing is left to stop, but the mark turns a requeue (its node lost) into a cancel.
    return _cancel_each(list(job_ids), why=why, actor=None, now=now, sealing_too=True)


def _cancel_each(job_ids: list[int], *, why: str, actor, now: datetime, sealing_too: bool = False) -> int:
    return sum(
        cancel_job(job_id=job_id, user=actor, now=now, why=why, sealing_too=sealing_too) for job_id in job_ids
    )


@transaction.atomic
def cancel_job(*, job_id: int, user, now: datetime, why: str = "", sealing_too: bool = False) -> bool:
    """Cancels a live job. Before RENT it ends unmetered; after, the node agent stops it and releases; once its
    process has ended (OUTPUT, sealing its outputs) there is nothing left to cancel: False, unless ``sealing_too``
    (an account deleted), where the cancel is only marked: a requeue (its node lost before the seal) becomes a
    cancel, and no attempt of it runs again.
    ``why``: what else the team reads of the cancel, when not asked for on its own (a member removed)."""
    job = Job.objects.select_for_update().filter(id=job_id).first()
    if job is None or not (job.cancellable or (sealing_too and job.is_alive)):
        return False
    if job.state in BEFORE_RENT:
        said = f"cancelled by {_actor(user)}" + (f": {why}" if why else "")
        # The job page and the API show it beside "cancelled"; a plain cancel leaves the detail as it was.
        detail = {"end_detail": why[:500]} if why else {}
        ended = transition(
            job_id=job_id, source=job.state, target=State.ENDED, now=now, actor=_actor(user),
            end_reason=EndReason.CANCELLED, reason=said, pending_reason="", **detail,
        )  # fmt: skip
        if ended:
            # A job waiting for a transfer slot gave its stager's thread back: none sees the cancel until its next
            # try. Its inputs read cancelled now, and that try removes its folder (``staging.stage_job``).
            cache_fill.cancel_inputs(job_id, states=("waiting",))
            if job.state == State.STAGING:  # it held a slot, or a place in the line for one: the next may go
                cache_fill.ring_next_in_line(now)
            dispatch.request_scheduler_pass()
        return ended
    # This attempt's parts only: an earlier attempt's processes started, and are gone.
    started = job.allocations.filter(attempt=job.attempt, started_at__isnull=False)
    if job.state == State.RENTED and not started.exists():
        # GPUs are held but no process of this attempt started yet: nothing to stop, so release now.
        return rental.release_job(job_id=job_id, attempt=job.attempt, end_reason=EndReason.CANCELLED, now=now,
                                  actor=_actor(user), detail=f"cancelled by {_actor(user)} before its process started")  # fmt: skip
    marked = Job.objects.filter(id=job_id, cancel_requested_at__isnull=True, state__in=HOLDS_COMPUTE).update(
        cancel_requested_at=now
    )
    if marked:
        JobEvent.objects.create(
            job_id=job_id, from_state=job.state, to_state=job.state, at=now,
            reason=f"cancel requested by {_actor(user)}" + (f": {why}" if why else ""), actor=_actor(user),
            attempt=job.attempt,
        )  # fmt: skip
        # The node agent watching this attempt polls the flag every second and stops the process group.
    return bool(marked)


def _actor(user) -> str:
    return getattr(user, "username", "") or "system"
