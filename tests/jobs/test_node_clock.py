"""A node's liveness is judged on the platform's clock: a node whose own clock is off is neither reaped
while it beats nor kept alive once it is silent."""

from datetime import UTC, datetime, timedelta

import pytest

from jobs import nodes
from jobs.lifecycle import State
from jobs.models import Allocation, Node
from tests.factories import NodeFactory
from tests.operations.conftest import running_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def test_an_agent_whose_clock_lags_is_declared_down_while_it_beats_and_loses_its_jobs(settings, team, now):
    """A GPU node's clock runs 40 s behind the control machine (no NTP on the node). Its agent beats
    every 5 s, but the heartbeat stores the agent's own ``timezone.now()``; the reaper, on the control
    worker's clock, sees every beat as 40 s old and declares the live node down, releasing the team's
    running job as a node loss. The agent re-registers at its next beat, and this repeats forever.
    A sign of life should be stamped with the database's (or the reaper's) clock, not the node's."""
    node = NodeFactory(name="gpu-skew", gpus=4, last_heartbeat=now)
    job = running_job(team=team, node=node, gpus=2, now=now)
    lag = timedelta(seconds=settings.E31_NODE_TIMEOUT_S + 10)
    # The agent beats now (by the real clock); its own clock says `now - lag`.
    assert nodes.heartbeat(name="gpu-skew", now=now - lag)
    assert nodes.reap_silent_nodes(now=now) == []  # it beat just now: it is not silent
    node.refresh_from_db()
    job.refresh_from_db()
    assert node.state == Node.NodeState.UP
    assert job.state == State.RUNNING
    assert Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_an_agent_whose_clock_runs_ahead_is_never_seen_silent(settings, team, now):
    """A node's clock runs an hour ahead. It beats once and its machine dies. The heartbeat row holds a
    time an hour in the future, so for an hour the reaper never declares it down, the health page counts
    it as beating and the pool page shows a negative age ("-3600 s ago"): the job on it stays rented
    (and metered) on a dead machine."""
    node = NodeFactory(name="gpu-ahead", gpus=4, last_heartbeat=now)
    job = running_job(team=team, node=node, gpus=1, now=now)
    assert nodes.heartbeat(name="gpu-ahead", now=now + timedelta(hours=1))  # its last beat, then silence
    later = now + timedelta(seconds=settings.E31_NODE_TIMEOUT_S + 30)
    assert nodes.reap_silent_nodes(now=later) == ["gpu-ahead"]
    job.refresh_from_db()
    assert job.state != State.RUNNING
