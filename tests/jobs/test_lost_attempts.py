"""E31_MAX_ATTEMPTS bounds the attempts a job loses to its nodes; preemptions, the scheduler's choice, never count."""

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from jobs import agent, nodes, rental
from jobs.lifecycle import PREEMPTED, EndReason, State
from jobs.models import Allocation, Job
from operations import pages
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db


def _preempted_twice_then_running(job, node, start):
    """Two preemptions for other jobs' reservations, then a third attempt holding the node's GPU."""
    now = start
    for _ in range(2):
        assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: (0,)}, now=now)
        now += timedelta(minutes=10)
        assert rental.request_preemption(job_id=job.id, now=now)
        assert rental.release_job(
            job_id=job.id, end_reason=PREEMPTED, now=now, actor="agent", requeue_as=PREEMPTED,
            detail="yielded its GPUs to a reserved job; paused with a checkpoint of 1 kB",
        )  # fmt: skip
        now += timedelta(minutes=1)
    _started(job, node, now)
    return now


def _started(job, node, now):
    """Rented and its process started (a part lost before its start spends no attempt: test_lost_before_start)."""
    assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: (0,)}, now=now)
    assert rental.start_allocation(
        allocation_id=Allocation.objects.get(job=job, released_at__isnull=True).id, now=now
    )


def _lose(node, now):
    rental.lose_node_allocations(node=node, now=now, detail=f"node {node.name} went silent")


@pytest.mark.parametrize(
    "declared",
    [
        {"requeue": True},
        {"checkpoint_signal": "USR1", "checkpoint_grace_s": 60, "checkpoint_bytes": 10**6},
    ],
    ids=["requeue", "checkpoint"],
)
def test_a_job_preempted_twice_is_still_requeued_after_its_first_node_loss(team, settings, declared):
    """Preempted twice on its way (attempt 3), a job that asked for a requeue, or that checkpoints, loses its
    node for the first time: it goes back to the queue (a checkpointing one keeps its checkpoint), and the
    operator's node page says so beforehand."""
    settings.E31_MAX_ATTEMPTS = 3
    node = NodeFactory(name="gpu-77", gpus=1)
    job = JobFactory(team=team, state="queued", preemptible=True, **declared)
    now = _preempted_twice_then_running(job, node, timezone.now() - timedelta(hours=1))
    [on_node] = pages.jobs_on_node(node)
    assert on_node.outcome.startswith("released and requeued") and "(lost attempt 1 of 3)" in on_node.outcome

    _lose(node, now + timedelta(minutes=5))

    job.refresh_from_db()
    assert (job.state, job.end_reason, job.attempt, job.lost_attempts) == ("queued", "", 3, 1)


def test_the_last_lost_attempt_ends_the_job(team, settings):
    settings.E31_MAX_ATTEMPTS = 2
    node = NodeFactory(name="gpu-78", gpus=1)
    job = JobFactory(team=team, state="queued", requeue=True)
    now = timezone.now() - timedelta(hours=1)
    for lost in range(2):
        _started(job, node, now)
        if lost:
            [on_node] = pages.jobs_on_node(node)
            assert on_node.outcome == "released and ended (node_lost): it has lost all 2 attempts it may"
        now += timedelta(minutes=5)
        _lose(node, now)
    job.refresh_from_db()
    assert (job.state, job.end_reason, job.lost_attempts) == ("released", "node_lost", 1)


def _part(allocation):
    allocation.refresh_from_db()
    return SimpleNamespace(job=Job.objects.get(id=allocation.job_id), allocation=allocation, rank=allocation.rank,
                           num_nodes=2)  # fmt: skip


def _two_parts_rank_1_exited(team, *, exit_code: int, outcome: EndReason):
    """A job on gpu-01 and gpu-02 that asked to be requeued after a node loss, both parts started, rank 1 exited
    5 s later: (the job, rank 0's allocation, when it started)."""
    job = JobFactory(team=team, gpus=2, requeue=True)
    now = timezone.now()
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,), "gpu-02": (0,)}, now=now)
    rank0, rank1 = Allocation.objects.filter(job=job).order_by("rank")
    for part in (rank0, rank1):
        assert rental.start_allocation(allocation_id=part.id, now=now)
    assert rental.finish_allocation(allocation_id=rank1.id, exit_code=exit_code, outcome=outcome,
                                    now=now + timedelta(seconds=5))  # fmt: skip
    return job, rank0, now


def test_a_node_lost_after_its_part_finished_requeues_the_job_as_lost_not_failed(pool, team):
    """Rank 1 exits 0 and waits for rank 0; then gpu-02 is lost, and rank 0 stops. The attempt ended as lost:
    requeued. Rank 1 used to keep its own 'succeeded' when released, so no part showed an early end, and a job
    that asked to be requeued after a node loss ended failed."""
    job, rank0, now = _two_parts_rank_1_exited(team, exit_code=0, outcome=EndReason.SUCCEEDED)
    nodes.set_node_state(name="gpu-02", target="down", now=now + timedelta(seconds=6), actor="olga")
    assert rental.stop_reason(allocation_id=rank0.id, now=now) == "sibling_failed"

    agent._after_exit(_part(rank0), None, "sibling_failed", -15)

    job.refresh_from_db()
    assert (job.state, job.lost_attempts) == (State.QUEUED, 1), (job.end_reason, job.end_detail)


def test_a_part_that_failed_before_its_node_was_lost_still_ends_the_job_failed(pool, team):
    """Rank 1 exits 1 (the job's own failure); while rank 0 is being stopped, gpu-02 is declared down. The
    attempt ended because the job failed: it ends failed, not requeued as a node loss it did not have."""
    job, rank0, now = _two_parts_rank_1_exited(team, exit_code=1, outcome=EndReason.FAILED)
    assert rental.stop_reason(allocation_id=rank0.id, now=now) == "sibling_failed"
    nodes.set_node_state(name="gpu-02", target="down", now=now + timedelta(seconds=6), actor="olga")

    agent._after_exit(_part(rank0), None, "sibling_failed", -15)

    job.refresh_from_db()
    assert (job.state, job.end_reason, job.lost_attempts) == (State.RELEASED, EndReason.FAILED, 0), (
        job.state,
        job.end_reason,
        job.end_detail,
    )


def test_a_part_lost_before_its_start_while_its_sibling_ran_still_counts_as_a_lost_attempt(pool, team):
    """Rank 0 runs on gpu-01; gpu-02 is lost before rank 1 started there. The attempt ran (on gpu-01), so it is a
    lost attempt, not a free retry: else a job could run again and again across flapping nodes, uncounted."""
    job = JobFactory(team=team, gpus=2, requeue=True)
    now = timezone.now()
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,), "gpu-02": (0,)}, now=now)
    rank0, rank1 = Allocation.objects.filter(job=job).order_by("rank")
    assert rental.start_allocation(allocation_id=rank0.id, now=now)
    nodes.set_node_state(name="gpu-02", target="down", now=now + timedelta(seconds=6), actor="olga")
    assert Allocation.objects.get(id=rank1.id).end_reason == EndReason.NODE_LOST

    agent._after_exit(_part(rank0), None, "sibling_failed", -15)

    job.refresh_from_db()
    assert (job.state, job.lost_attempts) == (State.QUEUED, 1), (job.end_reason, job.end_detail)
