"""The pool page, and drain / resume / mark down: confirmed, audited, and obeyed by the scheduler."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse

from jobs import nodes, rental, scheduler, snapshot
from jobs.lifecycle import EndReason, State
from jobs.management.commands import node_agent
from jobs.models import Allocation, Job, Node
from operations.models import AuditEntry
from tests.factories import JobFactory, NodeFactory
from tests.operations.conftest import HTMX, running_job

pytestmark = pytest.mark.django_db
POOL = reverse("operations:pool")


def action_url(node: str, action: str) -> str:
    return reverse("operations:node-action", args=[node, action])


def test_the_pool_page_draws_each_gpu_coloured_by_the_team_holding_it(operator_client, pool, team, now):
    job = running_job(team=team, node=pool[0], gpus=3, now=now - timedelta(minutes=5))
    page = operator_client.get(POOL).content.decode()
    assert page.count(f'class="gpu team-c{team.id % 12}"') == 3
    assert page.count('class="gpu free"') == 5
    assert f"job #{job.id} {job.name}" in page and "vision" in page
    assert (now - timedelta(minutes=5)).strftime("since %Y-%m-%d %H:%M UTC") in page
    assert reverse("jobs:detail", args=[job.id]) in page  # click opens the job
    assert "3 of 8 GPUs busy" in page.replace("<strong>", "").replace("</strong>", "")


def test_the_pool_page_shows_state_heartbeat_agent_version_and_shouts_unsandboxed(operator_client, now):
    NodeFactory(name="gpu-safe", agent_version="0.3.1", sandbox="bubblewrap")
    NodeFactory(
        name="gpu-open", agent_version="0.3.0", sandbox="none", last_heartbeat=now - timedelta(minutes=5)
    )
    page = operator_client.get(POOL).content.decode()
    assert "0.3.1" in page and "bubblewrap" in page and "0.3.0" in page
    assert '<strong class="badge loud">UNSANDBOXED</strong>' in page
    assert "1 UNSANDBOXED" in page
    assert re.search(r'class="bad">30\d s ago', page)  # silent past the reaper's timeout: shown in red


def test_the_pool_page_says_why_a_node_takes_one_node_jobs_only(operator_client):
    NodeFactory(name="gpu-lone", sandbox="bubblewrap", multi_node_refusal="the agent is not root: <no netns>")
    NodeFactory(name="gpu-wired", sandbox="bubblewrap")
    page = operator_client.get(POOL).content.decode()
    assert page.count("one-node jobs only") == 1
    assert "one-node jobs only: the agent is not root: &lt;no netns&gt;" in page


def test_the_pool_fragment_polls_itself_and_offers_actions_by_state(operator_client, pool):
    Node.objects.filter(name="gpu-02").update(state=Node.NodeState.DRAINING)
    fragment = operator_client.get(POOL, **HTMX).content.decode()
    assert fragment.lstrip().startswith('<section id="pool-grid"') and 'hx-trigger="every 5s"' in fragment
    assert "<html" not in fragment
    assert action_url("gpu-01", "drain") in fragment and action_url("gpu-01", "mark-down") in fragment
    assert action_url("gpu-02", "resume") in fragment and action_url("gpu-02", "drain") not in fragment
    # Each named with its node: a screen reader listing the links heard "drain", "drain", …
    assert 'aria-label="drain gpu-01"' in fragment and 'aria-label="resume gpu-02"' in fragment


def test_drain_asks_for_confirmation_first_and_does_nothing_unconfirmed(operator_client, pool):
    page = operator_client.get(action_url("gpu-01", "drain")).content.decode()
    assert 'name="confirm"' in page and "no new job" in page
    response = operator_client.post(action_url("gpu-01", "drain"))
    assert response.status_code == 422
    assert Node.objects.get(name="gpu-01").state == Node.NodeState.UP
    assert not AuditEntry.objects.exists()


def test_a_drained_node_gets_no_new_job_and_resume_gives_it_work_again(operator_client, pool, team, now):
    response = operator_client.post(action_url("gpu-01", "drain"), {"confirm": "yes"})
    assert response.status_code == 302 and response["Location"] == POOL
    assert Node.objects.get(name="gpu-01").state == Node.NodeState.DRAINING
    view = snapshot.take(now=now)
    assert {n.name: n.schedulable for n in view.nodes} == {"gpu-01": False, "gpu-02": True}

    jobs = [JobFactory(team=team, gpus=4, state=State.QUEUED, submitted_at=now) for _ in range(2)]
    scheduler.run_pass(now=now)
    assert not Allocation.objects.filter(node__name="gpu-01").exists()
    assert Allocation.objects.filter(node__name="gpu-02").count() == 1

    operator_client.post(action_url("gpu-01", "resume"), {"confirm": "yes"})
    scheduler.run_pass(now=now + timedelta(seconds=1))
    assert Allocation.objects.filter(node__name="gpu-01", job__in=jobs).count() == 1


def test_drain_lets_a_running_job_finish_where_it_is(operator_client, pool, team, now):
    job = running_job(team=team, node=pool[0], now=now)
    operator_client.post(action_url("gpu-01", "drain"), {"confirm": "yes"})
    job.refresh_from_db()
    assert job.state == State.RUNNING
    assert Allocation.objects.get(job=job).released_at is None


def test_a_draining_node_is_not_drained_while_its_disk_holds_outputs_not_yet_delivered(
    operator_client, pool, team, now
):
    """Delivery reads the outputs from the node's disk after RELEASE: called drained with one waiting there, the
    node looked safe to power off, and its job's outputs would be lost (failed a day later)."""
    job = running_job(team=team, node=pool[0], now=now, output_bytes=10)
    part = Allocation.objects.get(job=job)
    operator_client.post(action_url("gpu-01", "drain"), {"confirm": "yes"})
    rental.finish_allocation(allocation_id=part.id, exit_code=0, outcome=EndReason.SUCCEEDED, now=now)
    rental.seal_allocation(
        allocation_id=part.id, manifest=[{"path": "a.bin", "bytes": 10, "sha256": "0" * 64}], now=now
    )
    assert Job.objects.get(id=job.id).delivery_state == "delivering"

    nodes.settle_drains(now=now)
    assert Node.objects.get(name="gpu-01").state == Node.NodeState.DRAINING

    Allocation.objects.filter(id=part.id).update(delivered_at=now)
    nodes.settle_drains(now=now)
    assert Node.objects.get(name="gpu-01").state == Node.NodeState.DRAINED


def test_mark_down_releases_now_and_requeues_or_ends_each_job_as_declared(operator_client, pool, team, now):
    again = running_job(team=team, node=pool[0], gpus=2, requeue=True, now=now - timedelta(minutes=30))
    once = running_job(team=team, node=pool[0], gpus=2, requeue=False, now=now - timedelta(minutes=30))
    page = operator_client.get(action_url("gpu-01", "mark-down")).content.decode()
    assert "released and requeued" in page and "does not allow a requeue" in page

    operator_client.post(action_url("gpu-01", "mark-down"), {"confirm": "yes"})

    assert Node.objects.get(name="gpu-01").state == Node.NodeState.DOWN
    again.refresh_from_db()
    once.refresh_from_db()
    assert again.state == State.QUEUED
    assert (once.state, once.end_reason) == (State.RELEASED, EndReason.NODE_LOST)
    assert not Allocation.objects.filter(node__name="gpu-01", released_at__isnull=True).exists()
    assert set(Allocation.objects.values_list("end_reason", flat=True)) == {EndReason.NODE_LOST}
    assert not snapshot.take(now=now).running


def test_every_node_action_is_in_the_audit_log_with_before_and_after(
    operator_client, operator, pool, team, now
):
    job = running_job(team=team, node=pool[0], requeue=True, now=now)
    operator_client.post(action_url("gpu-02", "drain"), {"confirm": "yes"})
    operator_client.post(action_url("gpu-02", "resume"), {"confirm": "yes"})
    operator_client.post(action_url("gpu-01", "mark-down"), {"confirm": "yes"})
    entries = list(AuditEntry.objects.order_by("id"))
    assert [(e.actor, e.action, e.target) for e in entries] == [
        ("olga", "node.drain", "node:gpu-02"),
        ("olga", "node.resume", "node:gpu-02"),
        ("olga", "node.mark-down", "node:gpu-01"),
    ]
    assert entries[0].before["state"] == "up" and entries[0].after["state"] == "draining"
    down = entries[2]
    assert down.actor_user_id == operator.id
    assert down.before == {"state": "up", "jobs_holding_gpus": [job.id]}
    assert down.after == {
        "state": "down",
        "jobs_holding_gpus": [],
        "jobs_after_loss": {str(job.id): "queued"},
    }


def test_an_action_the_node_state_no_longer_allows_does_nothing(operator_client, pool):
    Node.objects.filter(name="gpu-01").update(state=Node.NodeState.DOWN)
    response = operator_client.post(action_url("gpu-01", "drain"), {"confirm": "yes"})
    assert response.status_code == 302
    assert Node.objects.get(name="gpu-01").state == Node.NodeState.DOWN
    assert not AuditEntry.objects.exists()
    assert operator_client.get(action_url("gpu-01", "explode")).status_code == 404
    assert operator_client.get(action_url("no-such-node", "drain")).status_code == 404


def test_the_pool_filter_lists_only_nodes_in_that_state(operator_client, pool):
    Node.objects.filter(name="gpu-02").update(state=Node.NodeState.DRAINED)
    page = operator_client.get(POOL, {"state": "drained"}).content.decode()
    assert 'id="node-' in page and "gpu-02" in page and "<strong>gpu-01</strong>" not in page
    assert Job.objects.count() == 0


def test_the_pool_page_shows_what_each_node_offers_jobs_and_which_limits_it_enforces(operator_client):
    NodeFactory(name="gpu-bound", memory_bytes=512 * 10**9, cpus=96, limits="memory v1, cpu v1, pids v1")
    NodeFactory(name="gpu-loose", memory_bytes=64 * 10**9, cpus=8, limits="none: no cgroup controllers found")
    page = operator_client.get(POOL).content.decode()
    assert "512.0 GB · 96 CPUs" in page and "limits: memory v1, cpu v1, pids v1" in page
    assert (
        '<strong class="badge loud">NO LIMITS</strong> <small>none: no cgroup controllers found</small>'
        in page
    )


def test_the_pool_page_shouts_a_node_whose_jobs_share_the_agents_uid(operator_client, monkeypatch):
    """An agent that is not root runs every job as itself: no uid of their own, and the page says so."""
    monkeypatch.setattr(node_agent.limits, "probe", lambda name: "memory, cpu, pids")
    monkeypatch.setattr(node_agent.limits, "probe_space", lambda jobs_dir: "")
    monkeypatch.setattr(node_agent.os, "geteuid", lambda: 1000)
    NodeFactory(name="gpu-user", sandbox="bubblewrap", limits=node_agent._limits("gpu-user"))
    monkeypatch.setattr(node_agent.os, "geteuid", lambda: 0)
    NodeFactory(name="gpu-root", sandbox="bubblewrap", limits=node_agent._limits("gpu-root"))
    rows = operator_client.get(POOL).content.decode().split('<tr id="node-')
    assert "SHARED UID</strong>" in next(r for r in rows if "gpu-user" in r)
    assert "SHARED UID" not in next(r for r in rows if "gpu-root" in r)


def test_the_pool_page_says_a_node_takes_no_new_work_while_its_disk_has_no_room(operator_client, now):
    NodeFactory(name="gpu-full", no_room_until=now + timedelta(minutes=4))
    NodeFactory(name="gpu-roomy", no_room_until=now - timedelta(minutes=1))  # its hold has passed
    page = operator_client.get(POOL).content.decode()
    assert page.count("NO ROOM") == 1
    until = (now + timedelta(minutes=4)).strftime("%H:%M UTC")
    assert "its disk could not hold an attempt's space, or a GPU was still in use" in page
    assert f"no new work until {until}" in page


def test_the_pool_page_shows_what_each_nodes_disk_can_still_give_attempt_spaces(operator_client, now):
    NodeFactory(name="gpu-bounded", disk_free_bytes=120 * 10**9, disk_free_at=now, disk_bytes=500 * 10**9)
    NodeFactory(name="gpu-unbounded")  # its agent bounds no attempt space, so measures nothing
    rows = operator_client.get(POOL).content.decode().split('<tr id="node-')
    assert "120.0 GB of 500.0 GB disk free for attempts" in next(r for r in rows if "gpu-bounded" in r)
    assert "disk free" not in next(r for r in rows if "gpu-unbounded" in r)
