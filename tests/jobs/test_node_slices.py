"""Each node owns a /24 of E31_JOB_SUBNET by a slot of its own, not by its id; without one it takes one-node jobs only."""

from datetime import timedelta

import pytest
from django.db import IntegrityError
from django.urls import reverse
from django.utils import timezone

from common import schema
from jobs import nodes, rental, scheduler
from jobs.models import Node
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db


def _register(name):
    return nodes.register_node(name=name, gpus=4, gpu_model="virtual", address="127.0.0.1", agent_version=schema.code().version,
                               sandbox="bubblewrap", now=timezone.now())  # fmt: skip


def test_a_node_gets_the_lowest_free_slot_whatever_its_id(settings):
    """A pool whose nodes come and go runs its ids past the subnet's slices: a /24 has one, and it is free."""
    settings.E31_JOB_SUBNET = "100.64.0.0/24"
    for _ in range(3):  # ids 1..3 used and gone: the next node's id is past the one slice
        NodeFactory().delete()
    node = _register("gpu-late")
    assert node.id > 1
    assert (node.network_slot, node.multi_node_refusal) == (0, "")
    assert _register("gpu-late").network_slot == 0  # re-registering keeps it


def test_a_node_finding_every_slot_held_is_refused_spanning_parts_and_the_pool_page_says_why(
    settings, operator_client
):
    settings.E31_JOB_SUBNET = "100.64.0.0/24"  # one /24: the first node holds it
    assert _register("gpu-first").network_slot == 0
    node = _register("gpu-second")
    assert node.network_slot is None and "belongs to another node" in node.multi_node_refusal
    node.refresh_from_db()
    assert (
        "belongs to another node" in node.multi_node_refusal
    )  # stored: the scheduler skips it for spanning jobs
    page = operator_client.get(reverse("operations:pool")).content.decode()
    assert "one-node jobs only: every /24" in page


def test_two_nodes_never_share_a_slot(settings):
    settings.E31_JOB_SUBNET = "100.64.0.0/10"
    slots = [_register(f"gpu-{i}").network_slot for i in range(5)]
    assert slots == [0, 1, 2, 3, 4]
    with pytest.raises(IntegrityError, match="network_slot"):
        Node.objects.filter(name="gpu-4").update(network_slot=0)  # the database refuses a shared /24


def test_a_spanning_job_no_node_set_can_hold_neither_reserves_nor_preempts():
    """Two 4-GPU nodes; gpu-02's agent cannot isolate a part of a job spanning nodes (multi_node_refusal),
    and runs a team's preemptible backlog job. An 8-GPU job can never be placed (it would need a part on
    gpu-02). The pass still reserves gpu-01 and gpu-02 for it "from now", preempts the backlog job for it,
    and the 8-GPU job's team is told it starts now: the backlog job loses its work for a start that never
    comes, and after its requeue both nodes sit idle under the reservation."""
    now = timezone.now()
    NodeFactory(name="gpu-01", gpus=4)
    NodeFactory(name="gpu-02", gpus=4, multi_node_refusal="the agent is not root: no network namespace")
    backlog = JobFactory(gpus=4, hours=4.0, preemptible=True)
    assert rental.rent_job(
        job_id=backlog.id, gpus_by_node={"gpu-02": (0, 1, 2, 3)}, now=now - timedelta(minutes=5)
    )
    wide = JobFactory(gpus=8, hours=1.0)

    scheduler.run_pass(now=now)

    backlog.refresh_from_db()
    wide.refresh_from_db()
    assert backlog.preempt_requested_at is None, "preempted for a job that can never start"
    assert wide.estimated_start is None, (wide.estimated_start, wide.pending_reason)
