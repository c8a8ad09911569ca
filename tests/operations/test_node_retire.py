"""Retiring a node: a decommissioned machine leaves the pool's list, its counts, health and metrics, and frees its
/24; its agent registering again puts the machine back in service."""

import logging
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.messages import get_messages
from django.db import IntegrityError, transaction
from django.urls import reverse

from common import schema
from jobs import nodes
from jobs import services as jobs_services
from jobs.models import Node
from operations import health, metrics, services
from operations.models import AuditEntry
from tests.operations.conftest import running_job

pytestmark = pytest.mark.django_db
POOL = reverse("operations:pool")


def action_url(node: str, action: str) -> str:
    return reverse("operations:node-action", args=[node, action])


def _register(name: str, now) -> Node:
    return nodes.register_node(
        name=name, gpus=4, gpu_model="virtual", address="", agent_version=schema.code().version,
        sandbox="bubblewrap", now=now,
    )  # fmt: skip


def _down_for_silence(name: str, now) -> None:
    """Its agent went silent and the reaper declared the node down, as for a machine switched off for good."""
    Node.objects.filter(name=name).update(
        last_heartbeat=now - timedelta(seconds=settings.E31_NODE_TIMEOUT_S + 60)
    )
    assert name in nodes.reap_silent_nodes(now=now)


def _retired(operator_client, name: str, now) -> Node:
    _down_for_silence(name, now)
    operator_client.post(action_url(name, "retire"), {"confirm": "yes"})
    return Node.objects.get(name=name)


def _main_list(page: str) -> str:
    return page.split("Retired nodes")[0]


def test_retire_is_offered_only_for_a_node_that_is_down(operator_client, pool, now):
    page = operator_client.get(POOL).content.decode()
    assert action_url("gpu-01", "retire") not in page
    # Not offered: the action's page sends the operator back to the pool.
    assert operator_client.get(action_url("gpu-01", "retire")).status_code == 302

    _down_for_silence("gpu-01", now)
    page = operator_client.get(POOL).content.decode()
    assert action_url("gpu-01", "retire") in page and action_url("gpu-02", "retire") not in page
    confirm = operator_client.get(action_url("gpu-01", "retire")).content.decode()
    assert "Retire gpu-01?" in confirm and "registers again" in confirm


def test_a_down_node_still_holding_an_allocation_is_not_retired(operator_client, pool, team, now):
    """A node down holds nothing: its allocations were released as it went down. Were one left open (a release
    that failed), retiring it would hide GPUs still metered: the retire refuses, on the page and in the writer."""
    running_job(team=team, node=pool[0], now=now)
    Node.objects.filter(name="gpu-01").update(state=Node.NodeState.DOWN)  # the release did not happen
    assert action_url("gpu-01", "retire") not in operator_client.get(POOL).content.decode()
    assert not services.change_node_state(name="gpu-01", action="retire", actor="olga", now=now)
    assert not nodes.retire_node(name="gpu-01", now=now, actor="olga")
    assert Node.objects.get(name="gpu-01").retired_at is None and not AuditEntry.objects.exists()


def test_retiring_a_node_frees_its_slot_is_audited_and_folds_it_away(operator_client, pool, now):
    slot = _register("gpu-01", now).network_slot
    assert slot is not None
    _down_for_silence("gpu-01", now + timedelta(seconds=1))
    response = operator_client.post(action_url("gpu-01", "retire"), {"confirm": "yes"}, follow=True)
    assert "gpu-01 is retired" in " ".join(str(m) for m in get_messages(response.wsgi_request))

    node = Node.objects.get(name="gpu-01")
    assert (node.state, node.retired_by, node.network_slot) == (Node.NodeState.DOWN, "olga", None)
    assert node.retired_at is not None
    entry = AuditEntry.objects.get()
    assert (entry.actor, entry.action, entry.target) == ("olga", "node.retire", "node:gpu-01")
    assert entry.before["network_slot"] == slot and entry.after["network_slot"] is None

    page = operator_client.get(POOL).content.decode()
    assert f'id="node-{node.id}-row"' not in page and f'id="node-{pool[1].id}-row"' in page
    assert "<details" in page and "Retired nodes" in page
    retired = page.split("Retired nodes")[1]
    assert "gpu-01" in retired and "olga" in retired and "4 &times; virtual" in retired
    assert _register("gpu-09", now).network_slot == slot  # a new machine takes its /24


def test_a_stale_page_retires_nothing_once_the_node_came_back(operator_client, pool, now):
    _down_for_silence("gpu-01", now)
    assert "Retire gpu-01?" in operator_client.get(action_url("gpu-01", "retire")).content.decode()
    _register("gpu-01", now + timedelta(seconds=5))  # its agent is back meanwhile
    assert not services.change_node_state(name="gpu-01", action="retire", actor="olga", now=now)
    operator_client.post(action_url("gpu-01", "retire"), {"confirm": "yes"})
    node = Node.objects.get(name="gpu-01")
    assert (node.state, node.retired_at) == (Node.NodeState.UP, None) and not AuditEntry.objects.exists()


def test_a_retired_node_takes_no_other_action(operator_client, pool, now):
    operator_client.post(action_url("gpu-01", "mark-down"), {"confirm": "yes"})  # held down by olga
    operator_client.post(action_url("gpu-01", "retire"), {"confirm": "yes"})
    assert Node.objects.get(name="gpu-01").retired_at is not None
    assert operator_client.get(action_url("gpu-01", "resume")).status_code == 404
    assert not services.change_node_state(name="gpu-01", action="resume", actor="olga", now=now)
    assert not services.change_node_state(name="gpu-01", action="retire", actor="olga", now=now)
    assert Node.objects.get(name="gpu-01").state == Node.NodeState.DOWN
    with pytest.raises(IntegrityError), transaction.atomic():  # the database keeps a retired node down
        Node.objects.filter(name="gpu-01").update(state=Node.NodeState.UP)


def test_retired_nodes_leave_every_count(operator_client, pool, now):
    _retired(operator_client, "gpu-01", now)
    Node.objects.filter(name="gpu-02").update(last_heartbeat=now)

    page = operator_client.get(POOL).content.decode()
    assert "1 up" in page and " down</span>" not in _main_list(page)
    assert "0 of 4 GPUs busy" in page.replace("<strong>", "").replace("</strong>", "")
    assert "1 of 1 live nodes" in health.agents(now=now).summary
    assert jobs_services.pool_limits().pool_gpus == 4

    samples = [s for family in metrics.node_families(now) for s in family.samples]
    assert not [s for s in samples if s.labels.get("node") == "gpu-01"]
    assert {s.labels["state"]: s.value for s in samples if s.name == "e31_nodes"}["down"] == 0


def test_health_does_not_name_retired_nodes_as_down(operator_client, pool, now):
    _retired(operator_client, "gpu-01", now)
    Node.objects.filter(name="gpu-02").update(state=Node.NodeState.DOWN)
    check = health.agents(now=now)
    assert not check.ok and "all 1 down" in check.summary
    assert "gpu-01" not in " ".join([check.summary, *check.detail])


def test_intake_counts_no_gpu_when_every_node_is_retired(operator_client, pool, now):
    _retired(operator_client, "gpu-01", now)
    _retired(operator_client, "gpu-02", now)
    limits = jobs_services.pool_limits()
    assert (limits.pool_gpus, limits.nodes) == (0, ())


def test_the_reaper_leaves_a_retired_node_alone(operator_client, pool, now):
    node = _retired(operator_client, "gpu-01", now)
    assert "gpu-01" not in nodes.reap_silent_nodes(now=now + timedelta(hours=1))
    again = Node.objects.get(name="gpu-01")
    assert (again.state, again.retired_at, again.state_changed_at) == (
        Node.NodeState.DOWN, node.retired_at, node.state_changed_at,
    )  # fmt: skip


def test_an_agent_registering_under_a_retired_name_puts_the_machine_back_in_service(
    operator_client, pool, now, caplog
):
    _register("gpu-01", now)
    _retired(operator_client, "gpu-01", now + timedelta(seconds=1))

    with caplog.at_level(logging.INFO, logger="jobs.nodes"):
        node = _register("gpu-01", now + timedelta(minutes=5))

    assert (node.state, node.retired_at, node.retired_by) == (Node.NodeState.UP, None, "")
    assert node.network_slot is not None  # it takes a /24 as a first registration does
    assert "gpu-01" in caplog.text and "retired" in caplog.text
    page = operator_client.get(POOL).content.decode()
    assert f'id="node-{node.id}-row"' in page and "Retired nodes" not in page


def test_a_machine_retired_while_held_down_comes_back_held_down(operator_client, pool, now):
    """Its agent registering brings it back as a restart does: an operator's mark-down still holds it down."""
    operator_client.post(action_url("gpu-01", "mark-down"), {"confirm": "yes"})
    operator_client.post(action_url("gpu-01", "retire"), {"confirm": "yes"})
    node = _register("gpu-01", now + timedelta(minutes=5))
    assert (node.state, node.held_down_by, node.retired_at) == (Node.NodeState.DOWN, "olga", None)
    assert action_url("gpu-01", "resume") in operator_client.get(POOL).content.decode()
