"""RENT, RUN, OUTPUT and RELEASE: the services that hold and free GPUs.

Invariants: a GPU is held by at most one active allocation (a partial unique index refuses the
second); every allocation that was rented is released, whatever happened, and releasing closes
its meter at that instant; a part of an attempt is released once its own process has stopped (or its
node is lost), and the job moves on (requeued or ended) only once every part of the attempt is
released, so a job never runs two attempts at once and no GPU is freed under a running process.
"""

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Min, Q, Subquery

from common import schema
from common.ledger_locks import lock_team_ledgers
from jobs import dispatch, selectors, signals, units
from jobs.lifecycle import HOLDS_COMPUTE, PREEMPTED, REQUEUED, RETRIED, EndReason, State
from jobs.models import Allocation, GpuHold, Job, JobEvent, Node, OutputFile, TeamUsage
from jobs.scheduling.types import gpus_held
from jobs.transitions import transition

log = logging.getLogger(__name__)
STOPPED = "stopped"  # a part stopped because another part of its attempt failed
NO_ROOM = "no_room"  # a part's disk could not hold its space: the job goes back to the queue while it may
GPU_BUSY = (
    "gpu_busy"  # a part's GPU was still used by a stopping process on its node: back to the queue, always
)
# A part whose node's agent never took its start message (the reconciler gave up ringing): back to the queue, always.
NOT_STARTED = "not_started"
# Ends by which the platform, not the job, kept a part's process from running: the GPUs it held meanwhile are
# metered as held and credited to its team in the same transaction, in these words
# (metering.services.credit_never_ran).
NEVER_RAN = {
    GPU_BUSY: "a GPU was still in use by a process that was stopping",
    NO_ROOM: "no room on the node for the attempt's space",
    NOT_STARTED: "its node's agent never started it",
}
# What ends an attempt early, before its output, in the order one beats another when its parts report several.
EARLY_ENDS = (
    EndReason.NODE_LOST, NO_ROOM, GPU_BUSY, NOT_STARTED, EndReason.FAILED, PREEMPTED, EndReason.CANCELLED,
)  # fmt: skip


def rent_job(
    *, job_id: int, gpus_by_node: dict[str, tuple[int, ...]], now: datetime, reason: str = "",
    after_queueing: bool = False,
) -> bool:  # fmt: skip
    """QUEUED -> RENTED: holds the GPUs and starts the meter. False if the job or a GPU was taken.

    ``after_queueing``: dated no earlier than the job was queued. A pass reads its clock before its snapshot, and
    a job the stager queued between the two was rented before it was queued: its history said QUEUED → RENTED
    before STAGING → QUEUED, and its meter ran while its inputs were still being staged."""
    try:
        with transaction.atomic():
            job = Job.objects.select_for_update().filter(id=job_id, state=State.QUEUED).first()
            if job is None or Allocation.objects.filter(job=job, released_at__isnull=True).exists():
                return False
            nodes = _lock_takers(gpus_by_node, now)
            if len(nodes) != len(gpus_by_node) or not _all_present(nodes, gpus_by_node):
                return False
            # After the nodes' rows, as a node's loss takes its node, then its jobs, then their teams' locks: a
            # budget weighed meanwhile (which holds the team's lock over its reads) counts this job once, as queued
            # or as held, never in neither.
            lock_team_ledgers([job.team_id])
            gpus_by_node, reason = _within_budget(job, gpus_by_node, reason, now)
            attempt = job.attempt + 1
            now = _rent_time(
                job, nodes, gpus_by_node, max(now, job.state_changed_at) if after_queueing else now
            )
            allocations = [
                _hold(job=job, attempt=attempt, node=nodes[name], rank=rank, indices=indices, now=now)
                for rank, (name, indices) in enumerate(gpus_by_node.items())
            ]
            transition(
                job_id=job.id, source=State.QUEUED, target=State.RENTED, now=now, actor="scheduler",
                reason=reason or "GPUs rented", attempt=attempt, estimated_start=None, pending_reason="",
            )  # fmt: skip
    except IntegrityError:
        log.info("job %s: a GPU was taken meanwhile; the next pass will place it", job_id)
        return False
    for allocation in allocations:
        dispatch.run_part(allocation.id, allocation.node.name)
    return True


def _within_budget(
    job: Job, gpus_by_node: dict[str, tuple[int, ...]], reason: str, now: datetime
) -> tuple[dict[str, tuple[int, ...]], str]:
    """The placement, trimmed to what the team's enforced budget leaves when it is wider than the job asked (an
    elastic start on idle GPUs): the submission weighed only the requested GPUs x hours. Called under the
    team's ledger lock, so the hours it finds left are not spent meanwhile."""
    extra = gpus_held(gpus_by_node) - job.gpus
    if extra <= 0:
        return gpus_by_node, reason
    more = selectors.budget_room_for_more_gpus(
        team=job.team, gpus=job.gpus, extra=extra, hours=job.hours, now=now, queued=True
    )
    if more == extra:
        return gpus_by_node, reason
    trimmed = _trimmed(gpus_by_node, job.gpus + more)
    where = units.placement(trimmed)
    limit = (
        f"{job.team.slug}'s enforced monthly budget leaves room for {more} more GPU{'s' if more != 1 else ''}"
    )
    return trimmed, (
        f"placed on {where} (elastic: {job.gpus + more} GPUs for {job.gpus} requested, up to {job.max_gpus}; "
        f"no wider: {limit} over the job's {job.hours:g} h)"
    )


def _trimmed(gpus_by_node: dict[str, tuple[int, ...]], keep: int) -> dict[str, tuple[int, ...]]:
    """``keep`` of the placement's GPUs: taken off the node holding most, highest index first; every node keeps
    one, as widening adds GPUs on the start's own nodes only."""
    held = {node: sorted(indices) for node, indices in gpus_by_node.items()}
    while sum(map(len, held.values())) > keep:
        fullest = max(held, key=lambda node: len(held[node]))
        if len(held[fullest]) == 1:
            break
        held[fullest].pop()
    return {node: tuple(indices) for node, indices in held.items()}


def _lock_takers(gpus_by_node: dict[str, tuple[int, ...]], now: datetime) -> dict[str, Node]:
    """The placement's nodes that still take its parts, locked as a GPU-set change locks them: the pass read the
    pool before, and a node may since have lost a GPU, or been held for its disk by its agent (a space refused
    there would waste the attempt), or its agent restarted on other code. A node whose agent cannot isolate a
    part of a job spanning nodes takes only single-node jobs."""
    up = Node.objects.select_for_update().filter(
        name__in=gpus_by_node, state=Node.NodeState.UP, agent_version=schema.code().version
    )
    up = up.exclude(no_room_until__gt=now).exclude(last_heartbeat__lt=silent_since(now))
    if len(gpus_by_node) > 1:
        up = up.filter(multi_node_refusal="")
    return {n.name: n for n in up.order_by("name")}


def _rent_time(
    job: Job, nodes: dict[str, Node], gpus_by_node: dict[str, tuple[int, ...]], now: datetime
) -> datetime:
    """``now``, or the release it would precede: a pass reads its clock before its snapshot, and a release that
    commits between the two (the job's last attempt, or a GPU's last holder) must not be followed by a RENT dated
    before it, or the job or the GPU is metered twice over the gap."""
    later = Allocation.objects.filter(released_at__gt=now).filter(
        Q(job=job) | Q(node__in=nodes.values())
    ).values_list("released_at", "node__name", "gpu_indices", "job_id")  # fmt: skip
    releases = [
        released for released, node, indices, holder in later
        if holder == job.id or set(indices) & set(gpus_by_node.get(node, ()))
    ]  # fmt: skip
    return max([now, *releases])


def _all_present(nodes: dict[str, Node], gpus_by_node: dict[str, tuple[int, ...]]) -> bool:
    present = selectors.present_gpus({node.id: node.gpus for node in nodes.values()})
    return all(set(indices) <= set(present[nodes[name].id]) for name, indices in gpus_by_node.items())


def _hold(*, job: Job, attempt: int, node: Node, rank: int, indices, now: datetime) -> Allocation:
    allocation = Allocation.objects.create(
        job=job, attempt=attempt, node=node, rank=rank, gpu_indices=sorted(indices), rented_at=now
    )
    GpuHold.objects.bulk_create(GpuHold(allocation=allocation, node=node, gpu_index=i) for i in indices)
    return allocation


def note_network(*, allocation_id: int, network: str) -> None:
    """Records the network the part's agent gave it, for the job page (offline, its job's parts, the internet)."""
    Allocation.objects.filter(id=allocation_id).update(network=network[:300])


def start_allocation(*, allocation_id: int, now: datetime, node_name: str | None = None) -> bool:
    """Claims an allocation for its node agent (``node_name``: only if it is that node's); the first part to start
    moves the job to RUNNING."""
    with transaction.atomic():
        _lock_job_of(allocation_id)
        ours = Q(node__name=node_name) if node_name is not None else Q()
        claimed = Allocation.objects.filter(
            ours, id=allocation_id, started_at__isnull=True, released_at__isnull=True
        ).update(started_at=now)
        if not claimed:
            return False
        allocation = Allocation.objects.select_related("node").get(id=allocation_id)
        # The claim is the agent's sign of life: the job's heartbeat otherwise kept its staging's, long past, and
        # the reconciler read a part still being prepared (its GPUs awaited, its space made) as a silent agent's.
        transition(
            job_id=allocation.job_id, source=State.RENTED, target=State.RUNNING, now=now,
            actor=agent_actor(allocation.node.name), reason="process started",
        )  # fmt: skip
        Job.objects.filter(id=allocation.job_id).update(
            worker_seen_at=now
        )  # each part's claim, the first's too
        return True


def agent_actor(node: str) -> str:
    """Who a node's agent is in a job's events."""
    return f"agent:{node}"


def _lock_job_of(allocation_id: int) -> None:
    """The job's row before its allocation's, the order a cancel and a release take them in: the other way round,
    a part starting or exiting as its job is cancelled or released waits for the row the other holds (a deadlock
    the database breaks by failing one of the two)."""
    job_id = Allocation.objects.filter(id=allocation_id).values("job_id")
    Job.objects.select_for_update().filter(id=Subquery(job_id)).values_list("id").first()


def finish_allocation(
    *, allocation_id: int, exit_code: int | None, outcome: EndReason, now: datetime
) -> bool:
    """Records a part's exit; when every part of the attempt has exited the job enters OUTPUT. False when the
    part has nothing to seal: its attempt is ending early (another part was released), and so is this part."""
    with transaction.atomic():
        _lock_job_of(allocation_id)
        # A part already released (its node lost while its agent cleaned up) keeps the end it was released with.
        Allocation.objects.filter(
            id=allocation_id, finished_at__isnull=True, released_at__isnull=True
        ).update(finished_at=now, exit_code=exit_code, end_reason=outcome)
        allocation = Allocation.objects.select_related("node").get(id=allocation_id)
        job = Job.objects.select_for_update().get(id=allocation.job_id)
        if job.attempt != allocation.attempt:
            return False
        if _attempt_parts(job).filter(released_at__isnull=False).exclude(_STOPPED_UNSTARTED).exists():
            release_part(
                allocation_id=allocation_id,
                end_reason=outcome,
                now=now,
                actor=agent_actor(allocation.node.name),
                exit_code=exit_code,
            )
            return False
        if outcome != EndReason.SUCCEEDED:
            _stop_unstarted(job, now=now)
        if _attempt_parts(job).filter(finished_at__isnull=True).exists():
            return True
        transition(
            job_id=job.id, source=State.RUNNING, target=State.OUTPUT, now=now,
            actor=agent_actor(allocation.node.name), reason=f"run ended: {outcome}",
        )  # fmt: skip
        _release_when_sealed(job.id, now=now, actor=agent_actor(allocation.node.name))
        return True


# A part stopped before it started, as another part of its attempt had exited failing: finished with nothing to
# seal or deliver, not an early end of the attempt.
_STOPPED_UNSTARTED = Q(started_at__isnull=True, finished_at__isnull=False, end_reason=STOPPED)


def _stop_unstarted(job: Job, *, now: datetime) -> None:
    """A part exited failing, so the attempt cannot succeed: its parts that have not started yet (their start
    message still queued on their nodes, or lost and rung again) would be stopped at once if they did
    (``stop_reason``). They are stopped now instead, their GPUs freed and meters closed, as ``release_part`` frees
    a part that is not running; and counted finished, with nothing to seal, so the attempt ends as its parts
    that ran decide: failed, with the failing part's exit code, and their outputs sealed and delivered. Without
    it the failed part's GPUs stayed held with nothing running until the reconciler took the quiet job for lost."""
    unstarted = list(
        _attempt_parts(job).filter(started_at__isnull=True, released_at__isnull=True).select_related("job")
    )
    if not unstarted:
        return
    Allocation.objects.filter(id__in=[p.id for p in unstarted]).update(
        finished_at=now, sealed_at=now, end_reason=STOPPED
    )
    for part in unstarted:
        part.end_reason = STOPPED
    _release_parts(unstarted, now=now, end_reason=STOPPED)


def seal_allocation(
    *, allocation_id: int, manifest: list[dict], now: datetime, refused: str = "", note: str = ""
) -> None:
    """Adds a part's sealed outputs to the job (a row per file); once every part is sealed, RELEASE. ``note``: what
    the seal left out, told on the job's page as an event.

    A part whose output broke the declaration (``refused``), or parts that together wrote more than
    ``output.bytes``, end the attempt ``output_failed``: nothing of it is delivered.
    """
    with transaction.atomic():
        allocation = Allocation.objects.select_related("node").get(id=allocation_id)
        job = Job.objects.select_for_update().get(id=allocation.job_id)
        if job.state not in (State.RUNNING, State.OUTPUT) or job.attempt != allocation.attempt:
            return
        if allocation.sealed_at is not None:
            return  # a redelivered task: this part's files are in already
        if note:
            JobEvent.objects.create(job_id=job.id, from_state=job.state, to_state=job.state, at=now,
                                    actor=agent_actor(allocation.node.name), reason=note[:300], attempt=job.attempt)  # fmt: skip
        if not refused:
            refused = _add_manifest(job, allocation.attempt, manifest)
        if refused:
            Allocation.objects.filter(id=allocation_id).update(end_reason=EndReason.OUTPUT_FAILED)
            Job.objects.filter(id=job.id).update(delivery_detail=refused[:500])
        Allocation.objects.filter(id=allocation_id, sealed_at__isnull=True).update(sealed_at=now)
        _release_when_sealed(job.id, now=now, actor=agent_actor(allocation.node.name))


def _add_manifest(job: Job, attempt: int, manifest: list[dict]) -> str:
    """Stores a part's files; '' or why the attempt's outputs, all parts together, break the declaration."""
    OutputFile.objects.bulk_create(
        (OutputFile(job_id=job.id, attempt=attempt, **entry) for entry in manifest), batch_size=2000
    )
    files = job.sealed_files + len(manifest)
    written = job.sealed_bytes + sum(entry["bytes"] for entry in manifest)
    Job.objects.filter(id=job.id).update(sealed_files=files, sealed_bytes=written)
    if files > settings.E31_MAX_OUTPUT_FILES:
        return f"wrote more than {settings.E31_MAX_OUTPUT_FILES:,} files, the most an attempt may seal (E31_MAX_OUTPUT_FILES)"
    if written > job.output_bytes:
        return f"wrote {written:,} bytes, declared {job.output_bytes:,} (output.bytes)"
    return ""


def _release_when_sealed(job_id: int, *, now: datetime, actor: str) -> None:
    """Parts finish and seal in any order on different nodes; the last of them releases the attempt."""
    job = Job.objects.get(id=job_id)
    parts = list(_attempt_parts(job))
    if job.state != State.OUTPUT or any(p.sealed_at is None for p in parts):
        return
    reason, exit_code = _attempt_outcome(parts)
    if reason == EndReason.OUTPUT_FAILED:
        release_job(job_id=job_id, attempt=job.attempt, end_reason=reason, now=now, actor=actor, exit_code=exit_code,
                    detail=f"output not delivered: {job.delivery_detail}")  # fmt: skip
        return
    detail = OUT_OF_MEMORY_DETAIL if reason == EndReason.OUT_OF_MEMORY else ""
    release_job(job_id=job_id, attempt=job.attempt, end_reason=reason, now=now, actor=actor, exit_code=exit_code,
                deliver=True, detail=detail)  # fmt: skip


OUT_OF_MEMORY_DETAIL = (
    "out of memory: the job went over its memory limit and the kernel stopped it "
    "(declare more with request.memory)"
)


def _attempt_parts(job: Job):
    return Allocation.objects.filter(job=job, attempt=job.attempt)


def _attempt_outcome(parts) -> tuple[EndReason, int | None]:
    """Output failed (nothing delivered) beats timed out beats out of memory beats failed beats succeeded;
    the exit code is the first failing part's."""
    reasons = {p.end_reason for p in parts}
    failed = sorted(
        (p for p in parts if p.end_reason in (EndReason.FAILED, EndReason.OUT_OF_MEMORY)),
        key=lambda p: (p.finished_at, p.rank),
    )
    failing = failed[0].exit_code if failed else None
    if EndReason.OUTPUT_FAILED in reasons:  # whatever the run did, its outputs are not delivered
        return EndReason.OUTPUT_FAILED, failing if failed else next((p.exit_code for p in parts), None)
    if EndReason.TIMED_OUT in reasons:
        return EndReason.TIMED_OUT, failing
    if EndReason.OUT_OF_MEMORY in reasons:
        return EndReason.OUT_OF_MEMORY, failing
    if EndReason.FAILED in reasons or STOPPED in reasons:
        return EndReason.FAILED, failing
    return EndReason.SUCCEEDED, 0


def release_job(
    *, job_id: int, end_reason: EndReason, now: datetime, actor: str, exit_code: int | None = None,
    detail: str = "", deliver: bool = False, requeue_as: str = "", last_heartbeat: datetime | None = None,
    attempt: int | None = None, silent_before: datetime | None = None,
) -> bool:  # fmt: skip
    """RELEASE: frees every GPU of the attempt and closes its meter at ``now``; then requeues or ends.

    For an attempt none of whose processes still runs (all sealed, none started) or whose agents went silent
    (the reconciler); a part that stops early is released on its own (``release_part``).
    ``requeue_as`` (REQUEUED after a node loss, PREEMPTED for a reservation) sends the job back to
    the queue for a new attempt instead of ending it; but a job whose team asked to cancel it ends
    cancelled, whatever stopped it first: it never runs again. ``attempt``: only while the job is
    still on it (an agent of an attempt that was replaced, or a reaper that read the job before
    taking its lock, must not end the attempt that replaced it). ``silent_before``: only while neither its
    agent nor a move of the job was heard of since (the reconciler read it silent before taking the lock, and an
    agent that reported its exit or a beat meanwhile must not be overruled).
    """
    with transaction.atomic():
        rows = Job.objects.select_for_update().filter(id=job_id, state__in=HOLDS_COMPUTE)
        if silent_before is not None:
            rows = rows.filter(worker_seen_at__lt=silent_before, state_changed_at__lt=silent_before)
        job = (rows if attempt is None else rows.filter(attempt=attempt)).first()
        if job is None:
            return False
        end_reason, requeue_as, detail = _cancel_wins(job, end_reason, requeue_as, detail)
        held = list(Allocation.objects.filter(job=job, released_at__isnull=True))
        now = _release_parts(held, now=now, end_reason=end_reason, last_heartbeat=last_heartbeat)
        return _move_released(job, end_reason=end_reason, now=now, actor=actor, exit_code=exit_code, detail=detail,
                              deliver=deliver, requeue_as=requeue_as)  # fmt: skip


def _cancel_wins(job: Job, end_reason: str, requeue_as: str, detail: str) -> tuple[str, str, str]:
    """A job whose team asked to cancel it is never requeued, whatever ended its attempt first."""
    if requeue_as and job.cancel_requested_at is not None:
        detail = f"cancelled as requested; the attempt had ended: {detail or end_reason}"
        return EndReason.CANCELLED, "", detail
    return end_reason, requeue_as, detail


def _release_parts(
    parts: list[Allocation], *, now: datetime, end_reason: str, last_heartbeat=None, early: bool = False,
    credit: str = "",
) -> datetime:  # fmt: skip
    """Frees the parts' GPUs and closes their meters, crediting their held time where ``credit`` says why;
    returns when (``now``, or the latest rent among them, or the end of an hour their meters closed already)."""
    # A caller reads ``now`` before it waits for the job's lock, and a rent may commit meanwhile
    # (a cancel racing the scheduler): a release never precedes its rent, so it happens at it. The hourly accrual
    # may have closed an hour meanwhile too (it skips a job whose row is locked, not one about to be): a release
    # never precedes what the meter counted, so it happens at that hour's end.
    closed = signals.meter_closed_after([allocation.id for allocation in parts]) if parts else None
    now = max([now, *(allocation.rented_at for allocation in parts), *([closed] if closed else [])])
    for allocation in parts:
        _release_allocation(
            allocation,
            now=now,
            end_reason=end_reason,
            last_heartbeat=last_heartbeat,
            early=early,
            credit=credit,
        )
    return now


def release_part(
    *, allocation_id: int, end_reason: str, now: datetime, actor: str, exit_code: int | None = None,
    detail: str = "", last_heartbeat: datetime | None = None, released_at: datetime | None = None,
) -> bool:  # fmt: skip
    """An attempt ends early (cancel, preemption, its agent failed or found no room, its node was lost): frees
    this part's GPUs and closes its meter now (or at ``released_at``, when its node was lost earlier than it was
    found), with those of its parts whose processes are not running (never started, or exited) now;
    ``stop_reason`` tells the others to stop, and each is released as it reports. The last part released
    requeues or ends the job, now, as the attempt's first early end (``EARLY_ENDS``) decides.
    False if the part was released already or its attempt replaced."""
    with transaction.atomic():
        _lock_job_of(allocation_id)
        part = Allocation.objects.select_related("job").get(id=allocation_id)
        job = Job.objects.filter(id=part.job_id, attempt=part.attempt, state__in=HOLDS_COMPUTE).first()
        if job is None or part.released_at is not None:
            return False
        parts = list(_attempt_parts(job).select_related("job"))
        first = all(p.released_at is None for p in parts)
        if exit_code is not None:
            Allocation.objects.filter(id=part.id, exit_code__isnull=True).update(exit_code=exit_code)
        never_ran = NEVER_RAN.get(end_reason, "")
        ended = _release_parts(
            [part],
            now=released_at or now,
            end_reason=end_reason,
            last_heartbeat=last_heartbeat,
            early=end_reason in EARLY_ENDS,
            credit=never_ran,
        )
        now = max(now, ended)  # the job's change and its other parts: never before this part's end
        idle = [p for p in parts if p.id != part.id and p.released_at is None and _not_running(p)]
        now = _release_parts([p for p in idle if p.started_at], now=now, end_reason=STOPPED)
        # Siblings the platform's end kept from starting never ran either.
        now = _release_parts(
            [p for p in idle if not p.started_at], now=now, end_reason=STOPPED, credit=never_ran
        )
        ending = (
            _early_end(job, end_reason, exit_code, detail)
            if first
            else _first_early_end(job, end_reason, detail)
        )
        if not _attempt_parts(job).filter(released_at__isnull=True).exists():
            return _move_released(job, now=now, actor=actor, deliver=False, **ending)
        if first:  # kept for the last part released; the job page shows it meanwhile
            Job.objects.filter(id=job.id).update(end_detail=detail[:500])
            said = f"part {part.rank} ended ({end_reason}): {detail or end_reason}; stopping the other parts"
            JobEvent.objects.create(job_id=job.id, from_state=job.state, to_state=job.state, at=now,
                                    actor=actor[:150], attempt=job.attempt, reason=said[:300])  # fmt: skip
        return True


def release_unstarted(*, allocation_id: int, now: datetime, detail: str) -> bool:
    """A part whose node's agent never took its start message (the reconciler rang it again and again): its GPUs,
    held with nothing running, are freed and its meter closed, and its job goes back to the queue without spending
    an attempt (``NOT_STARTED``); its other parts are told to stop, as for any early end. The job's time limit
    runs from its first start, so without this nothing would ever end it. False if it started meanwhile (the
    start and this release take the job's row first), or was released already."""
    with transaction.atomic():
        _lock_job_of(allocation_id)
        if not Allocation.objects.filter(id=allocation_id, started_at__isnull=True).exists():
            return False
        return release_part(
            allocation_id=allocation_id, end_reason=NOT_STARTED, now=now, actor="reconciler", detail=detail
        )


def _not_running(part: Allocation) -> bool:
    return part.started_at is None or part.finished_at is not None


def _first_early_end(job: Job, reason: str, detail: str) -> dict:
    """How the attempt's first early end said it ends (``EARLY_ENDS`` orders those released at one instant),
    with the detail it gave, or the last part's own on the same end (a preemption's checkpoint is measured once
    rank 0 stopped); failed, when the part that ended it had exited already (its agent failed sealing)."""
    parts = [p for p in _attempt_parts(job) if p.end_reason in EARLY_ENDS]
    first = min(parts, key=lambda p: (p.released_at, EARLY_ENDS.index(p.end_reason)), default=None)
    decided = first.end_reason if first else EndReason.FAILED
    if not (detail and reason == decided):
        detail = Job.objects.values_list("end_detail", flat=True).get(id=job.id)
    return _early_end(job, decided, first.exit_code if first else None, detail)


def _early_end(job: Job, reason: str, exit_code: int | None, detail: str) -> dict:
    """What an early end does to the job: a lost node or no room requeues it while it may, a preemption always
    (but a cancel asked for wins), anything else ends it."""
    requeue_as = {
        EndReason.NODE_LOST: REQUEUED if requeues_after_loss(job) else "",
        NO_ROOM: REQUEUED if has_attempts_left(job) else "",
        GPU_BUSY: RETRIED,  # the platform's overlap, not the job's: it spends none of its attempts
        NOT_STARTED: RETRIED,  # nor its node's agent, deaf to its start: none either
        PREEMPTED: PREEMPTED,
    }.get(reason, "")
    end_reason = EndReason.FAILED if reason in (NO_ROOM, GPU_BUSY, NOT_STARTED) else reason
    end_reason, requeue_as, detail = _cancel_wins(job, end_reason, requeue_as, detail)
    return {"end_reason": end_reason, "requeue_as": requeue_as, "detail": detail, "exit_code": exit_code}


def _move_released(
    job: Job, *, end_reason: str, now: datetime, actor: str, exit_code: int | None, detail: str, deliver: bool,
    requeue_as: str,
) -> bool:  # fmt: skip
    """Every part of the attempt is released: the job goes back to the queue (``requeue_as``) or ends."""
    if requeue_as:
        moved = transition(
            job_id=job.id, source=job.state, target=State.QUEUED, now=now, actor=actor, via=requeue_as,
            reason=f"{requeue_as}: {detail or end_reason}", cancel_requested_at=None, preempt_requested_at=None,
            sealed_files=0, sealed_bytes=0, delivery_detail="",  # the next attempt seals its own files
            end_detail="", lost_attempts=F("lost_attempts") + int(requeue_as == REQUEUED),
        )  # fmt: skip
    else:
        moved = transition(
            job_id=job.id, source=job.state, target=State.RELEASED, now=now, actor=actor,
            end_reason=end_reason, reason=detail or str(end_reason), exit_code=exit_code,
            end_detail=detail[:500], delivery_state="delivering" if deliver and job.outputs_pending() else "",
        )  # fmt: skip
    dispatch.request_scheduler_pass()
    if deliver and not requeue_as and moved and job.outputs_pending():
        parts = Allocation.objects.filter(job=job, attempt=job.attempt)
        # A part stopped before it started wrote nothing: delivered as it is (its node is not asked for it).
        parts.filter(started_at__isnull=True, delivered_at__isnull=True).update(delivered_at=now)
        for part in parts.filter(started_at__isnull=False).select_related("node"):
            dispatch.deliver_part(part.id, part.node.name)
    return moved


def _release_allocation(
    allocation: Allocation,
    *,
    now: datetime,
    end_reason: str,
    last_heartbeat,
    early: bool = False,
    credit: str = "",
) -> None:
    """A part keeps its own end (how its process ended), unless ``early`` and it had none or succeeded: released
    for an attempt's early end, which ``_first_early_end`` reads from the parts (a part that finished, waiting for
    its siblings when its node was lost, ends its attempt as lost; one that failed still ends it failed)."""
    released = Allocation.objects.filter(id=allocation.id, released_at__isnull=True).update(
        released_at=now,
        end_reason=end_reason
        if early and allocation.end_reason in ("", EndReason.SUCCEEDED)
        else allocation.end_reason or end_reason,
        last_heartbeat_at_release=last_heartbeat,
    )
    if not released:
        return
    GpuHold.objects.filter(allocation=allocation, active=True).update(active=False)
    signals.allocation_released.send(
        sender=Allocation, allocation_id=allocation.id, released_at=now, credit=credit
    )
    if not credit:  # what the platform kept from running is not the team's use of the pool either
        held_s = (now - allocation.rented_at).total_seconds() * len(allocation.gpu_indices)
        TeamUsage.add(team_id=allocation.job.team_id, gpu_seconds=held_s, now=now)


def request_preemption(*, job_id: int, now: datetime) -> bool:
    """Asks the node agent to stop a preemptible job (TERM, grace) so a reserved job can start."""
    with transaction.atomic():
        marked = Job.objects.filter(
            id=job_id, preemptible=True, state__in=HOLDS_COMPUTE, preempt_requested_at__isnull=True
        ).update(preempt_requested_at=now)
        if marked:
            state, attempt = Job.objects.values_list("state", "attempt").get(id=job_id)
            JobEvent.objects.create(
                job_id=job_id, from_state=state, to_state=state, at=now, actor="scheduler",
                reason="preemption requested: a reserved job needs these GPUs", attempt=attempt,
            )  # fmt: skip
        return bool(marked)


def note_checkpoint(*, job_id: int, attempt: int, held_bytes: int, note: str, now: datetime) -> None:
    """What a pausable job's attempt left in its checkpoint directory, as its node measured it (and why
    nothing, when it broke its bound); an older attempt never overwrites a newer one's."""
    with transaction.atomic():
        noted = Job.objects.filter(id=job_id, attempt=attempt).update(checkpoint_held_bytes=held_bytes)
        if noted and note:
            state = Job.objects.values_list("state", flat=True).get(id=job_id)
            JobEvent.objects.create(job_id=job_id, from_state=state, to_state=state, at=now,
                                    actor="agent", reason=note[:300], attempt=attempt)  # fmt: skip


def requeues_after_loss(job: Job) -> bool:
    """A node loss requeues a job that asked for it, or one that checkpoints (it resumes from its last one)."""
    return (job.requeue or job.checkpoints) and has_attempts_left(job)


def has_attempts_left(job: Job) -> bool:
    """Whether a lost attempt may be followed by another: at most E31_MAX_ATTEMPTS attempts end by a node loss
    or a node's refusal, this one included; the attempts preemptions ended are not counted."""
    return job.lost_attempts + 1 < settings.E31_MAX_ATTEMPTS


def lose_node_allocations(
    *, node: Node, now: datetime, detail: str, gpu_indices: Sequence[int] | None = None
) -> int:
    """A node was declared down (or only ``gpu_indices`` of it are gone): release the parts there (nothing more
    can be known of their processes), and requeue their jobs that allow it once their other parts stopped.

    Released when the node was lost: now, or, for a node silent longer than E31_NODE_TIMEOUT_S, when the reaper
    would have declared it down. Nothing ran the reaper meanwhile (the embedded console stopped with its agent,
    or beat down for hours), and the outage is not held GPU-time. Their jobs change now, as do their other parts."""
    lost_at = _lost_at(node, now)
    lost = Allocation.objects.filter(node=node, released_at__isnull=True)
    if gpu_indices is not None:
        holding = GpuHold.objects.filter(node=node, gpu_index__in=gpu_indices, active=True)
        lost = lost.filter(id__in=holding.values("allocation_id"))
    parts = dict(lost.values_list("job_id", "id"))  # a node holds one part of an attempt
    lock_for_release(parts)
    # Read once every job is locked: a start takes its job's row first. An attempt none of whose parts has started
    # (here or on its other nodes) lost nothing of the job's: it goes back to the queue as for an agent deaf to its
    # start, spending no attempt. One that ran elsewhere is a lost attempt, counted, whichever node went first.
    ran_jobs = attempts_that_ran(parts)
    for job_id in sorted(parts):  # its other parts are told to stop, and released as each stops
        before_start = job_id not in ran_jobs
        release_part(
            allocation_id=parts[job_id], end_reason=NOT_STARTED if before_start else EndReason.NODE_LOST, now=now,
            actor="reaper", detail=f"{detail}, before the job's process started" if before_start else detail,
            last_heartbeat=node.last_heartbeat, released_at=lost_at,
        )  # fmt: skip
    return len(parts)


def attempts_that_ran(job_ids) -> set[int]:
    """Of these jobs (ids, or a query of them), those whose current attempt has a part that started: a node lost
    under any other attempt spends none of the job's (lose_node_allocations, and the mark-down page beforehand)."""
    ran = Allocation.objects.filter(job_id__in=job_ids, attempt=F("job__attempt"), started_at__isnull=False)
    return set(ran.values_list("job_id", flat=True))


def silent_since(now: datetime) -> datetime:
    """A node whose last heartbeat is older than this is silent: the reaper declares it down, and no pass places
    anything on it meanwhile (a part placed there would be lost before its process started)."""
    return now - timedelta(seconds=settings.E31_NODE_TIMEOUT_S)


def _lost_at(node: Node, now: datetime) -> datetime:
    if node.last_heartbeat is None:
        return now
    return min(now, node.last_heartbeat + timedelta(seconds=settings.E31_NODE_TIMEOUT_S))


def lock_for_release(job_ids: Iterable[int]) -> None:
    """Before a transaction releases several jobs: their rows (by id), then their teams' ledger locks.

    The order a single RELEASE takes them in (its job, then its team's ledger as it closes the meter),
    for all the jobs at once: never one team's lock held while waiting for another job's row
    (``common.ledger_locks`` tells the cycle this rules out).
    """
    rows = Job.objects.select_for_update().filter(id__in=list(job_ids)).order_by("id")
    lock_team_ledgers(rows.values_list("team_id", flat=True))


def stop_reason(*, allocation_id: int, now: datetime) -> str:
    """Why the agent should stop this part now, or '' to keep running (polled every second)."""
    row = (
        Allocation.objects.filter(id=allocation_id)
        .values(
            "released_at", "started_at", "attempt", "job__attempt", "job__hours",
            "job__cancel_requested_at", "job__preempt_requested_at", "job_id",
        )
        .first()
    )  # fmt: skip
    if row is None or row["released_at"] is not None or row["attempt"] != row["job__attempt"]:
        return "released"
    if row["job__cancel_requested_at"]:
        return EndReason.CANCELLED
    parts = Allocation.objects.filter(job_id=row["job_id"], attempt=row["attempt"])
    # Before a preemption: the limit ends a checkpoint's grace as it ends any run (read every second through it).
    if row["started_at"] and _ran_out_of_hours(parts, hours=row["job__hours"], now=now):
        return EndReason.TIMED_OUT
    if row["job__preempt_requested_at"]:
        return PREEMPTED
    # A part that failed, or was released early (its node lost, its agent failed): the attempt cannot go on.
    failed_sibling = parts.filter(
        Q(released_at__isnull=False) | Q(finished_at__isnull=False) & ~Q(end_reason=EndReason.SUCCEEDED)
    )
    return "sibling_failed" if failed_sibling.exclude(id=allocation_id).exists() else ""


def _ran_out_of_hours(parts, *, hours: float, now: datetime) -> bool:
    """The limit runs from the attempt's first start: a part that started late is held to the job's hours,
    not given its own."""
    first = parts.aggregate(first=Min("started_at"))["first"]
    return first is not None and (now - first).total_seconds() >= hours * 3600


def store_log_tail(*, job_id: int, attempt: int, text: str) -> None:
    """The job page's rolling log tail; a part of an attempt that was replaced never overwrites it. A NUL the job
    printed is shown as U+FFFD: the column is text, which PostgreSQL refuses a NUL in (the whole log keeps it)."""
    Job.objects.filter(id=job_id, attempt=attempt).update(log_tail=text.replace("\x00", "\ufffd"))


def note_worker_alive(*, job_id: int, attempt: int, now: datetime) -> None:
    """The agent of ``attempt`` is alive; an attempt that was replaced since its agent last looked says nothing,
    or it would keep a silent agent of the new attempt from being found by the reconciler."""
    Job.objects.filter(id=job_id, attempt=attempt).update(worker_seen_at=now)
