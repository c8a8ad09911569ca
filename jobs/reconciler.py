"""Re-drives any job stuck in a state longer than it should be: a lost message delays, never loses."""

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Exists, F, OuterRef, Q, QuerySet

from jobs import delivery, dispatch, nodes, rental
from jobs.lifecycle import REQUEUED, EndReason, State
from jobs.models import Allocation, Dependency, Job, Node

log = logging.getLogger(__name__)
# How many E31_RECONCILE_AFTER_S a rented part may wait for its node's agent to take its start message (rung
# again each time) before its GPUs are freed and its job goes back to the queue.
START_WAIT_PERIODS = 5


@dataclass
class Findings:
    """What one reconciler run found and re-drove, for the health page and logs."""

    restaged: list[int] = field(default_factory=list)
    restarted: list[int] = field(default_factory=list)
    unstarted_released: list[int] = field(default_factory=list)  # parts whose node never took their start
    abandoned: list[int] = field(default_factory=list)
    redelivered: list[int] = field(default_factory=list)
    delivered: list[int] = field(default_factory=list)  # jobs whose every part was delivered, now marked so
    undeliverable: list[int] = field(default_factory=list)  # jobs whose outputs' node is gone for good

    def total(self) -> int:
        found = (
            self.restaged,
            self.restarted,
            self.unstarted_released,
            self.abandoned,
            self.redelivered,
            self.delivered,
            self.undeliverable,
        )
        return sum(map(len, found))


def reconcile(*, now: datetime) -> Findings:
    stale = now - timedelta(seconds=settings.E31_RECONCILE_AFTER_S)
    findings = Findings()

    def fail_stranded() -> None:
        findings.undeliverable = delivery.fail_stranded(now=now)

    def finish_delivered() -> None:
        findings.delivered = delivery.finish_delivered_jobs()

    steps = (
        lambda: _restage(stale, findings),
        lambda: _restart_unstarted(stale, now, findings),
        lambda: _abandon_silent(stale, now, findings),
        fail_stranded,
        lambda: _redeliver(stale, findings),
        finish_delivered,
        dispatch.request_scheduler_pass,
    )
    for step in steps:
        try:
            step()
        except Exception:  # one row a step cannot handle must not stop the other steps, run after run
            log.exception("a reconciler step failed; the others go on, and it is tried again next run")
    if findings.total():
        log.warning("reconciler re-drove %s", findings)
    return findings


# What each step finds, also read (without acting) by the operators' health page.


def to_restage(stale: datetime) -> QuerySet[Job]:
    """Submitted or staging jobs no worker has been heard on since ``stale``."""
    submitted = Q(state=State.SUBMITTED, state_changed_at__lt=stale)
    staging = Q(state=State.STAGING) & (Q(worker_seen_at__lt=stale) | Q(worker_seen_at__isnull=True))
    # A submitted job with prerequisites is not stale: every scheduler pass stages it once they are met.
    submitted &= ~Exists(Dependency.objects.filter(job=OuterRef("pk")))
    return Job.objects.filter(submitted | staging)


def unstarted(stale: datetime) -> QuerySet[Allocation]:
    """Parts rented before ``stale`` whose process never started."""
    return Allocation.objects.filter(released_at__isnull=True, started_at__isnull=True, rented_at__lt=stale)


def silent(stale: datetime) -> QuerySet[Job]:
    """Running or sealing jobs no agent has reported on since ``stale``, every part of their attempt started."""
    waiting_for_a_start = Allocation.objects.filter(
        job=OuterRef("pk"), attempt=OuterRef("attempt"), started_at__isnull=True, released_at__isnull=True
    )
    return Job.objects.filter(
        state__in=(State.RUNNING, State.OUTPUT), worker_seen_at__lt=stale, state_changed_at__lt=stale
    ).exclude(Exists(waiting_for_a_start))


def undelivered(stale: datetime) -> QuerySet[Allocation]:
    """Parts of the attempt each delivering job delivers, released before ``stale`` and not delivered yet."""
    return Allocation.objects.filter(
        job__delivery_state="delivering",
        attempt=F("job__attempt"),
        delivered_at__isnull=True,
        released_at__lt=stale,
    )


def _repeat_expires_s() -> float:
    """A repeated stage_job is dropped unread once the next run has rung its own: while no stager takes them the
    queue holds two per job at most, not one more every run. Only for the platform's own workers, whose clocks
    keep time with the database's: a node's clock need not, and one ahead would drop every repeat it was sent."""
    return 2 * settings.E31_RECONCILE_EVERY_S


def _restage(stale: datetime, findings: Findings) -> None:
    for job_id in to_restage(stale).values_list("id", flat=True)[:500]:
        dispatch.stage_job(job_id, expires_s=_repeat_expires_s())
        findings.restaged.append(job_id)


def _restart_unstarted(stale: datetime, now: datetime, findings: Findings) -> None:
    """RENTED but never started: the run message was lost; a duplicate is harmless (the start is a claim).

    Not for ever: a node whose agent beats but takes none of its messages (its consumer cut off from the broker,
    or its threads all taken) would hold the part's GPUs, metered with nothing running, with no end (the job's
    time limit runs from its first start). Past START_WAIT_PERIODS x E31_RECONCILE_AFTER_S the part is released,
    its job goes back to the queue without spending an attempt, and the node takes no new work for a while
    (E31_NO_ROOM_HOLD_S), so the job is not handed straight back to it."""
    waited_s = START_WAIT_PERIODS * settings.E31_RECONCILE_AFTER_S
    given_up = now - timedelta(seconds=waited_s)
    rows = unstarted(stale).values_list("id", "node_id", "node__name", "rented_at")
    for allocation_id, node_id, node, rented_at in rows[:500]:
        if rented_at >= given_up:
            dispatch.run_part(allocation_id, node)
            findings.restarted.append(allocation_id)
            continue
        detail = (
            f"not started: {node}'s agent took no start message in {waited_s:g} s, its GPUs held with nothing "
            "running; freed, and the job goes back to the queue without spending an attempt"
        )
        if rental.release_unstarted(allocation_id=allocation_id, now=now, detail=detail):
            nodes.hold_for_room(node_id=node_id, now=now)
            findings.unstarted_released.append(allocation_id)


def _abandon_silent(stale: datetime, now: datetime, findings: Findings) -> None:
    """Running or sealing with no word from its agent although the node still beats: release it.

    Not while a part of its attempt has not started: the quiet is that part's start, still queued on its node or
    lost (``_restart_unstarted`` rings it again, and gives up on it in time), not an agent lost. The silence is
    read again on the job's locked row: an agent that reports (a beat, its part's exit) meanwhile is not
    overruled."""
    for job in silent(stale)[:100]:
        requeue = rental.requeues_after_loss(job)
        if rental.release_job(
            job_id=job.id, end_reason=EndReason.NODE_LOST, now=now, actor="reconciler",
            detail="its node agent stopped reporting on it", requeue_as=REQUEUED if requeue else "",
            attempt=job.attempt, silent_before=stale,
        ):  # fmt: skip
            findings.abandoned.append(job.id)


def _redeliver(stale: datetime, findings: Findings) -> None:
    """Rings again the undelivered parts of the attempt each delivering job is delivering (not earlier ones), but
    not on a node down for silence: no agent takes them meanwhile; once it is back the next run rings them, or
    ``fail_stranded`` gives them up. A node an operator holds down still beats, and delivers."""
    gone = Q(node__state=Node.NodeState.DOWN, node__held_down_by="")
    for allocation_id, node in undelivered(stale).exclude(gone).values_list("id", "node__name")[:200]:
        dispatch.deliver_part(allocation_id, node)
        findings.redelivered.append(allocation_id)
