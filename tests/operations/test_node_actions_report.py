"""Node actions report what happened: a drain is under way, a mark-down holds until a resume."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.messages import get_messages
from django.urls import reverse

from common import schema
from jobs import nodes, scheduler
from jobs.lifecycle import State
from jobs.models import Allocation, Node
from tests.factories import JobFactory
from tests.operations.conftest import running_job

pytestmark = pytest.mark.django_db
POOL = reverse("operations:pool")


def action_url(node: str, action: str) -> str:
    return reverse("operations:node-action", args=[node, action])


def _said(response) -> str:
    return " ".join(str(m) for m in get_messages(response.wsgi_request))


def _register(name: str, now) -> Node:
    return nodes.register_node(
        name=name,
        gpus=4,
        gpu_model="",
        address="",
        agent_version=schema.code().version,
        sandbox="bubblewrap",
        now=now,
    )


def test_draining_a_busy_node_says_it_is_draining_not_done(operator_client, pool, team, now):
    running_job(team=team, node=pool[0], now=now)
    response = operator_client.post(action_url("gpu-01", "drain"), {"confirm": "yes"}, follow=True)
    said = _said(response)
    assert "drain done" not in said
    assert "gpu-01 is draining" in said and "1 running job ends" in said
    assert Node.objects.get(name="gpu-01").state == Node.NodeState.DRAINING


def test_draining_an_idle_node_says_when_it_will_be_drained(operator_client, pool):
    response = operator_client.post(action_url("gpu-02", "drain"), {"confirm": "yes"}, follow=True)
    said = _said(response)
    assert "gpu-02 is draining" in said and "next scheduler pass" in said


def test_a_node_marked_down_stays_down_while_its_agent_heartbeats(operator_client, pool, now):
    operator_client.post(action_url("gpu-01", "mark-down"), {"confirm": "yes"})
    before = now - timedelta(minutes=1)
    Node.objects.filter(name="gpu-01").update(last_heartbeat=before)
    later = now + timedelta(seconds=10)
    assert nodes.heartbeat(name="gpu-01", now=later)  # the agent need not register again
    _register("gpu-01", later)  # and if it does (restarted), the operator's hold still stands
    node = Node.objects.get(name="gpu-01")
    assert node.state == Node.NodeState.DOWN and node.held_down_by == "olga"
    # The beat is stamped with the database's clock, not the agent's `later`: a node's clock is not trusted.
    assert node.last_heartbeat > before  # the pool page still sees the agent alive
    assert "gpu-01" not in nodes.reap_silent_nodes(now=later + timedelta(hours=1))


def test_the_mark_down_message_says_it_holds_until_resumed(operator_client, pool):
    response = operator_client.post(action_url("gpu-01", "mark-down"), {"confirm": "yes"}, follow=True)
    said = _said(response)
    assert "until an operator resumes it" in said


def test_an_operator_resumes_a_node_marked_down(operator_client, pool, now):
    operator_client.post(action_url("gpu-01", "mark-down"), {"confirm": "yes"})
    page = operator_client.get(POOL).content.decode()
    assert action_url("gpu-01", "resume") in page
    operator_client.post(action_url("gpu-01", "resume"), {"confirm": "yes"})
    node = Node.objects.get(name="gpu-01")
    assert node.state == Node.NodeState.UP and node.held_down_by == ""


def test_a_node_declared_down_for_silence_comes_back_when_its_agent_registers(pool, now):
    Node.objects.filter(name="gpu-01").update(last_heartbeat=now - timedelta(hours=1))
    assert nodes.reap_silent_nodes(now=now) == ["gpu-01"]
    assert not nodes.heartbeat(name="gpu-01", now=now)
    _register("gpu-01", now)
    assert Node.objects.get(name="gpu-01").state == Node.NodeState.UP


def test_a_drained_node_rebooted_for_maintenance_comes_back_drained(operator_client, pool, now):
    """An operator drains gpu-01 and reboots it: silent past the reaper's timeout, it is declared down;
    when its agent registers again the node is drained, not up, and takes new work only once resumed."""
    operator_client.post(action_url("gpu-01", "drain"), {"confirm": "yes"})
    nodes.settle_drains(now=now)
    later = now + timedelta(seconds=settings.E31_NODE_TIMEOUT_S + 60)
    Node.objects.filter(name="gpu-02").update(last_heartbeat=later)  # the other node keeps beating
    assert nodes.reap_silent_nodes(now=later) == ["gpu-01"]
    assert "then stays drained (drained by olga)" in operator_client.get(POOL).content.decode()

    _register("gpu-01", later + timedelta(seconds=30))

    assert Node.objects.get(name="gpu-01").state == Node.NodeState.DRAINED
    operator_client.post(action_url("gpu-01", "resume"), {"confirm": "yes"})
    node = Node.objects.get(name="gpu-01")
    assert (node.state, node.drained_by) == (Node.NodeState.UP, "")


def test_a_node_down_for_silence_can_be_held_down_before_its_agent_returns(operator_client, pool, now):
    """A flaky machine went silent and was declared down: no action was offered, so it came back up at its agent's
    next restart and took work again. Marking it down holds it down, as for a node marked down while up."""
    later = now + timedelta(seconds=settings.E31_NODE_TIMEOUT_S + 60)
    Node.objects.filter(name="gpu-02").update(last_heartbeat=later)
    assert nodes.reap_silent_nodes(now=later) == ["gpu-01"]
    down_since = Node.objects.get(name="gpu-01").state_changed_at
    assert action_url("gpu-01", "mark-down") in operator_client.get(POOL).content.decode()
    confirm = operator_client.get(action_url("gpu-01", "mark-down")).content.decode()
    assert "already down" in confirm

    done = operator_client.post(action_url("gpu-01", "mark-down"), {"confirm": "yes"})
    assert "gpu-01 is held down" in str(next(iter(get_messages(done.wsgi_request))))
    node = Node.objects.get(name="gpu-01")
    assert (node.state, node.held_down_by, node.state_changed_at) == (Node.NodeState.DOWN, "olga", down_since)
    _register("gpu-01", later + timedelta(seconds=30))
    assert Node.objects.get(name="gpu-01").state == Node.NodeState.DOWN
    assert action_url("gpu-01", "resume") in operator_client.get(POOL).content.decode()


def test_a_node_down_for_silence_offers_no_resume(operator_client, pool, now):
    Node.objects.filter(name="gpu-01").update(state=Node.NodeState.DOWN)
    page = operator_client.get(POOL).content.decode()
    assert action_url("gpu-01", "resume") not in page and "waits for its agent" in page


def test_resuming_a_node_whose_agent_is_silent_waits_for_the_agent_before_placing_work(
    operator_client, pool, team, now
):
    """Reproduction: gpu-01 marked down for repair and switched off; "resume" made it up at once, the next pass
    rented a queued job there (the meter on), and the reaper then lost it (no requeue: ended node_lost)."""
    operator_client.post(action_url("gpu-01", "mark-down"), {"confirm": "yes"})
    Node.objects.filter(name="gpu-01").update(last_heartbeat=now - timedelta(hours=1))
    Node.objects.filter(name="gpu-02").update(state=Node.NodeState.DRAINED)  # the only place is gpu-01
    job = JobFactory(team=team, state=State.QUEUED, gpus=2, requeue=False)

    response = operator_client.post(action_url("gpu-01", "resume"), {"confirm": "yes"}, follow=True)
    scheduler.run_pass(now=now)

    node = Node.objects.get(name="gpu-01")
    assert (node.state, node.held_down_by) == (Node.NodeState.DOWN, "")
    assert "comes back when its agent" in _said(response)
    job.refresh_from_db()
    assert job.state == State.QUEUED and not Allocation.objects.filter(job=job).exists()
    _register("gpu-01", now + timedelta(seconds=5))  # the machine is back: its agent registers
    assert Node.objects.get(name="gpu-01").state == Node.NodeState.UP
