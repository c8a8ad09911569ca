"""A node whose id has no /24 of its own in E31_JOB_SUBNET takes one-node jobs only, and the pool page says why."""

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs import nodes

pytestmark = pytest.mark.django_db


def _register(name):
    return nodes.register_node(name=name, gpus=4, gpu_model="virtual", address="127.0.0.1", agent_version="t",
                               sandbox="bubblewrap", now=timezone.now())  # fmt: skip


def test_a_node_without_a_slice_of_its_own_is_refused_spanning_parts_and_the_pool_page_says_why(
    settings, operator_client
):
    settings.E31_JOB_SUBNET = "100.64.0.0/24"  # one /24: only node id 0 would own it, and no node has id 0
    node = _register("gpu-wrapped")
    assert "no /24 of its own" in node.multi_node_refusal
    node.refresh_from_db()
    assert "no /24 of its own" in node.multi_node_refusal  # stored: the scheduler skips it for spanning jobs
    page = operator_client.get(reverse("operations:pool")).content.decode()
    assert "one-node jobs only: node id" in page


def test_a_node_with_a_slice_of_its_own_keeps_spanning_parts(settings):
    settings.E31_JOB_SUBNET = "100.64.0.0/10"
    assert _register("gpu-sliced").multi_node_refusal == ""
