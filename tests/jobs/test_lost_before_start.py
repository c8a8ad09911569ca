"""A node lost before a job's process started there: the job never ran, so it neither ends as lost nor spends one
of its attempts; and no pass places work on a node already silent past the timeout."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import nodes, rental, scheduler
from jobs.models import Allocation, Job, Node
from operations import pages
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("requeue", [False, True])
def test_a_node_lost_before_the_process_started_sends_the_job_back_without_spending_an_attempt(team, requeue):
    """It ended ``node_lost`` (a job that had not asked for a requeue), or spent one of its E31_MAX_ATTEMPTS."""
    node = NodeFactory(name="gpu-51", gpus=1)
    job = JobFactory(team=team, state="queued", requeue=requeue)
    now = timezone.now()
    assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: (0,)}, now=now)
    [on_node] = pages.jobs_on_node(node)  # what the operator's mark-down page says it will do
    assert on_node.outcome.startswith("released and requeued") and "no attempt is spent" in on_node.outcome

    rental.lose_node_allocations(node=node, now=now + timedelta(seconds=30), detail="gpu-51 marked down")

    job.refresh_from_db()
    assert (job.state, job.end_reason, job.lost_attempts) == ("queued", "", 0)
    part = Allocation.objects.get(job=job)
    assert part.end_reason == rental.NOT_STARTED and part.released_at is not None
    said = job.events.order_by("-id").first().reason
    assert "gpu-51 marked down" in said and "before" in said


def test_a_node_lost_while_the_process_ran_still_counts(team):
    node = NodeFactory(name="gpu-52", gpus=1)
    job = JobFactory(team=team, state="queued", requeue=False)
    now = timezone.now()
    assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: (0,)}, now=now)
    part = Allocation.objects.get(job=job)
    assert rental.start_allocation(allocation_id=part.id, now=now)

    rental.lose_node_allocations(node=node, now=now + timedelta(seconds=30), detail="gpu-52 marked down")

    job.refresh_from_db()
    assert (job.state, job.end_reason) == ("released", "node_lost")


def test_a_pass_places_nothing_on_a_node_silent_past_the_timeout(team, settings):
    """The node was still UP (the reaper had not run yet): the pass rented it, the reaper then declared it down,
    and the job ended ``node_lost`` without ever starting."""
    now = timezone.now()
    silent = NodeFactory(
        name="gpu-53", gpus=1, last_heartbeat=now - timedelta(seconds=settings.E31_NODE_TIMEOUT_S + 60)
    )
    job = JobFactory(team=team, state="queued", gpus=1)

    scheduler.run_pass(now=now)

    job.refresh_from_db()
    assert job.state == "queued" and not Allocation.objects.filter(job=job).exists()
    NodeFactory(name="gpu-54", gpus=1, last_heartbeat=now)
    scheduler.run_pass(now=now)
    assert Allocation.objects.get(job=job).node.name == "gpu-54"
    assert nodes.reap_silent_nodes(now=now) == [silent.name]
    assert Node.objects.get(name="gpu-53").state == Node.NodeState.DOWN
    assert Job.objects.get(id=job.id).state == "rented"
