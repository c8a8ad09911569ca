"""A node agent runs only the code the database's schema was migrated for: it will not start against another,
and one that finds the schema changed under it takes no new work while its running jobs finish."""

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from common import schema
from jobs import leftovers, nodes, sandbox, snapshot
from jobs.lifecycle import State
from jobs.management.commands import node_agent
from jobs.models import Allocation, Node
from tests.common.schema_rows import code_newer, database_newer
from tests.factories import TeamFactory
from tests.operations.conftest import running_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
def nothing_touched(monkeypatch):
    """What an agent does on its way to registering, each recorded: a refusal must come before all of it."""
    done = []

    def went_on(*args, **kwargs):
        done.append("find GPUs")
        raise RuntimeError("the agent went on past its check")

    monkeypatch.setattr(node_agent, "_find_gpus", went_on)
    monkeypatch.setattr(sandbox, "claim_uids", lambda *a, **k: done.append("claim uids"))
    monkeypatch.setattr(leftovers, "sweep", lambda **k: done.append("sweep") or [])
    monkeypatch.setattr(nodes, "register_node", lambda **k: done.append("register"))
    return done


def _start(name: str) -> None:
    call_command("node_agent", "--name", name, "--virtual-gpus", "2", "--allow-unsandboxed")


def test_an_agent_does_not_start_against_a_database_migrated_by_newer_code(nothing_touched):
    with database_newer() as future, pytest.raises(CommandError) as refused:
        _start("gpu-old")
    assert str(refused.value) == (
        f"node gpu-old not started: the database has migrations this code does not know: {future}; "
        "upgrade this machine's checkout"
    )
    assert nothing_touched == [] and not Node.objects.filter(name="gpu-old").exists()


def test_an_agent_does_not_start_against_a_database_not_yet_migrated(nothing_touched):
    with code_newer() as latest, pytest.raises(CommandError) as refused:
        _start("gpu-new")
    assert (
        f"this code has migrations the database lacks: {latest}; run `python manage.py migrate` first"
        in str(refused.value)
    )
    assert nothing_touched == []


def _register(name: str, now: datetime) -> dict:
    register = {"name": name, "gpus": 4, "gpu_model": "virtual", "address": "127.0.0.1",
                "agent_version": schema.code().version, "sandbox": "bubblewrap"}  # fmt: skip
    nodes.register_node(now=now, **register)
    return register


def test_an_agent_that_finds_the_schema_changed_under_it_takes_no_new_work_and_its_job_runs_on(now):
    _register("gpu-07", now)
    job = running_job(team=TeamFactory(), node=Node.objects.get(name="gpu-07"), now=now)
    seen = schema.applied(connection)
    with database_newer() as future:
        node_agent._look_at_schema("gpu-07", seen)
        node = Node.objects.get(name="gpu-07")
        assert node.state == Node.NodeState.DRAINING
        assert node.drained_by.startswith(nodes.UPGRADE_DRAIN) and future in node.drained_by
        assert {n.name: n.schedulable for n in snapshot.take(now=now).nodes} == {"gpu-07": False}
        nodes.settle_drains(now=now)  # its job still runs: the node stays draining until it ends
        job.refresh_from_db()
        assert job.state == State.RUNNING and Allocation.objects.get(job=job).released_at is None
        assert Node.objects.get(name="gpu-07").state == Node.NodeState.DRAINING


def test_a_look_that_finds_the_schema_unchanged_is_one_query_and_changes_nothing(
    now, django_assert_num_queries
):
    _register("gpu-07", now)
    seen = schema.applied(connection)
    with django_assert_num_queries(1):
        assert node_agent._look_at_schema("gpu-07", seen) == seen
    assert Node.objects.get(name="gpu-07").state == Node.NodeState.UP


def test_an_agent_restarted_on_code_that_matches_the_schema_takes_work_again(now):
    register = _register("gpu-07", now)
    seen = schema.applied(connection)
    with database_newer():
        node_agent._look_at_schema("gpu-07", seen)
        nodes.settle_drains(now=now)
        assert Node.objects.get(name="gpu-07").state == Node.NodeState.DRAINED
    # The checkout upgraded: this code knows every migration applied, and the agent starts again.
    node_agent._register(register)
    node = Node.objects.get(name="gpu-07")
    assert (node.state, node.drained_by) == (Node.NodeState.UP, "")


def test_an_agent_on_old_code_that_registers_again_after_a_silence_stays_drained(now):
    register = _register("gpu-07", now)
    seen = schema.applied(connection)
    with database_newer():
        node_agent._look_at_schema("gpu-07", seen)
        Node.objects.filter(name="gpu-07").update(last_heartbeat=now - timedelta(minutes=5))
        assert nodes.reap_silent_nodes(now=now) == ["gpu-07"]
        nodes.register_node(now=now, **register)  # what its heartbeat does once told the node is down
        assert Node.objects.get(name="gpu-07").state == Node.NodeState.DRAINED


def test_an_operators_drain_is_left_as_the_operator_left_it(now):
    register = _register("gpu-07", now)
    nodes.set_node_state(name="gpu-07", target=Node.NodeState.DRAINING, now=now, actor="olga")
    seen = schema.applied(connection)
    with database_newer():
        node_agent._look_at_schema("gpu-07", seen)
        assert Node.objects.get(name="gpu-07").drained_by == "olga"
    node_agent._register(register)
    node = Node.objects.get(name="gpu-07")
    assert (node.state, node.drained_by) == (Node.NodeState.DRAINING, "olga")


class Registered(Exception):
    """Stops the agent at its registration: what follows (threads, the Celery worker) is not under test."""


def test_the_agent_registers_the_version_of_its_code_not_a_constant(settings, tmp_path, monkeypatch):
    settings.E31_AGENT_ROOT = tmp_path / "agents"
    registered = {}

    def register(**fields):
        registered.update(fields)
        raise Registered

    monkeypatch.setattr(node_agent, "_check_the_view", lambda name: None)
    monkeypatch.setattr(node_agent, "_limits", lambda name: "none: not probed here")
    monkeypatch.setattr(sandbox, "claim_uids", lambda *a, **k: None)
    monkeypatch.setattr(leftovers, "sweep", lambda **k: [])
    monkeypatch.setattr(nodes, "register_node", register)
    with pytest.raises(Registered):
        _start("gpu-07")
    assert registered["agent_version"] == schema.code().version
    assert len(registered["agent_version"]) == 12 and registered["agent_version"] != "1.0"


@pytest.mark.django_db(transaction=True)
def test_the_agents_watch_drains_its_node_soon_after_a_newer_checkout_migrates(now, monkeypatch):
    """The thread the agent starts: the migrations change under it, and within its next look the node drains."""
    monkeypatch.setattr(node_agent, "SCHEMA_LOOK_S", 0.05)
    _register("gpu-07", now)
    stop, seen = threading.Event(), schema.applied(connection)  # what the agent saw when it started

    def watch() -> None:
        try:
            node_agent._watch_schema("gpu-07", seen, stop)
        finally:
            connection.close()  # this thread's own connection

    thread = threading.Thread(target=watch)
    with database_newer():
        thread.start()
        try:
            deadline = time.monotonic() + 10
            while Node.objects.get(name="gpu-07").state == Node.NodeState.UP and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            stop.set()
            thread.join(timeout=5)
    assert Node.objects.get(name="gpu-07").state == Node.NodeState.DRAINING
