"""E31_MAX_ATTEMPTS bounds the attempts a job loses to its nodes; preemptions, the scheduler's choice, never count."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import rental
from jobs.lifecycle import PREEMPTED
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
    assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: (0,)}, now=now)
    return now


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
        assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: (0,)}, now=now)
        if lost:
            [on_node] = pages.jobs_on_node(node)
            assert on_node.outcome == "released and ended (node_lost): it has lost all 2 attempts it may"
        now += timedelta(minutes=5)
        _lose(node, now)
    job.refresh_from_db()
    assert (job.state, job.end_reason, job.lost_attempts) == ("released", "node_lost", 1)
