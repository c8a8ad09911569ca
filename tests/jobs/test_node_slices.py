"""Each node owns a /24 of E31_JOB_SUBNET by a slot of its own, not by its id; without one it takes one-node jobs only."""

import pytest
from django.db import IntegrityError
from django.urls import reverse
from django.utils import timezone

from jobs import nodes
from jobs.models import Node
from tests.factories import NodeFactory

pytestmark = pytest.mark.django_db


def _register(name):
    return nodes.register_node(name=name, gpus=4, gpu_model="virtual", address="127.0.0.1", agent_version="t",
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
