"""The scheduler places work only on nodes whose agent runs the scheduler's own code.

During an upgrade a node's old agent notices the new schema within a minute and drains its node; until it
does, a worker already on the new code must not place a job there (the old agent would run it with rows shaped
for the other schema), and an old worker not yet stopped must not place one on a node whose agent is already
on the new code.
"""

import pytest
from django.utils import timezone

from jobs import rental, scheduler, snapshot
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db


def test_a_node_whose_agent_runs_other_code_takes_no_work():
    now = timezone.now()
    NodeFactory(name="gpu-old", agent_version="0123456789ab")
    NodeFactory(name="gpu-new")
    job = JobFactory(gpus=1, hours=1.0)
    by_name = {n.name: n for n in snapshot.take(now=now).nodes}
    assert not by_name["gpu-old"].schedulable and by_name["gpu-new"].schedulable
    scheduler.run_pass(now=now)
    assert job.allocations.get().node.name == "gpu-new"


def test_a_job_waits_while_every_node_runs_other_code():
    now = timezone.now()
    NodeFactory(name="gpu-old", agent_version="0123456789ab")
    job = JobFactory(gpus=1, hours=1.0)
    scheduler.run_pass(now=now)
    job.refresh_from_db()
    assert job.state == "queued" and not job.allocations.exists()
    assert (
        job.pending_reason
        == "no node in the pool is taking jobs now (all draining, drained, down or mid-upgrade)"
    )


def test_a_node_that_registers_other_code_after_the_pass_read_the_pool_is_not_rented(monkeypatch):
    """The agent restarts on another checkout between the pass's read and its RENT: the RENT re-checks the
    node's code under its row lock, as it does for a drain."""
    now = timezone.now()
    node = NodeFactory(name="gpu-01", gpus=4)
    job = JobFactory(gpus=1, hours=1.0)
    take = snapshot.take

    def read_then_agent_restarts(*, now):
        view = take(now=now)
        type(node).objects.filter(id=node.id).update(agent_version="0123456789ab")
        return view

    monkeypatch.setattr(snapshot, "take", read_then_agent_restarts)
    scheduler.run_pass(now=now)
    job.refresh_from_db()
    assert job.state == "queued" and not job.allocations.exists()


def test_rent_refuses_a_node_on_other_code():
    NodeFactory(name="gpu-01", agent_version="0123456789ab")
    assert not rental.rent_job(job_id=JobFactory().id, gpus_by_node={"gpu-01": (0,)}, now=timezone.now())
