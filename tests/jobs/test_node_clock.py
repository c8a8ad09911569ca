"""A node's clock is not the platform's: its liveness is judged, and what its agent reports dated and metered,
on the database's time, whether the node's clock runs ahead or behind."""

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
import time_machine
from django.db import connection
from django.utils import timezone

from jobs import agent, clock, nodes, rental
from jobs.lifecycle import EndReason, State
from jobs.models import Allocation, Job, Node
from tests.factories import JobFactory, NodeFactory
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


@pytest.fixture
def skewed_node(monkeypatch):
    """This process as an agent on a node whose clock is ``skew`` off (the database keeps the real time);
    the correction is undone after the test."""
    travels = []
    monkeypatch.setattr(clock, "_reading", None)  # restored after the test: other tests read none

    def skew(by: timedelta) -> None:
        travel = time_machine.travel(datetime.now(UTC) + by, tick=True)
        travel.start()
        travels.append(travel)
        clock.synchronise()  # as the agent does when it registers and at every beat

    yield skew
    for travel in travels:
        travel.stop()


def _database_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


@pytest.mark.parametrize("skew_h", [3, -3], ids=["node_clock_ahead", "node_clock_behind"])
def test_an_agent_corrects_its_clock_by_the_databases(skewed_node, skew_h):
    """The agent measures the database's time against its own and dates its reports with the correction."""
    skewed_node(timedelta(hours=skew_h))
    assert abs(timezone.now() - _database_now() - timedelta(hours=skew_h)) < timedelta(
        seconds=2
    )  # its own clock
    assert abs(clock.now() - _database_now()) < timedelta(seconds=2)  # what it dates its reports with


@pytest.mark.parametrize("skew_h", [3, -3], ids=["node_clock_ahead", "node_clock_behind"])
def test_a_run_reported_by_an_agent_whose_clock_is_off_is_metered_for_the_time_it_held(
    pool, team, tmp_path, skewed_node, skew_h
):
    """A job holds one GPU for 10 minutes on a node whose clock is 3 hours off. Dated by the node's clock, its
    release was 3 hours in the future (the team billed 3 h 10 min) or clamped to its rent (10 minutes metered
    as nothing), and the reconciler took a running job for silent. Dated on the database's time, the release
    is now and the 10 minutes are what the meter counts; the job's signs of life are fresh."""
    rented = timezone.now() - timedelta(minutes=10)
    job = JobFactory(team=team, output_bytes=2**20)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=rented)
    allocation = Allocation.objects.get(job=job)
    assert rental.start_allocation(allocation_id=allocation.id, now=rented)
    skewed_node(timedelta(hours=skew_h))
    (tmp_path / "output").mkdir()
    part = SimpleNamespace(job=job, allocation=allocation, rank=0, num_nodes=1)
    agent._after_exit(part, SimpleNamespace(output=tmp_path / "output"), EndReason.SUCCEEDED, 0)
    allocation.refresh_from_db()
    held = allocation.released_at - allocation.rented_at
    assert timedelta(minutes=10) <= held < timedelta(minutes=10, seconds=30), held
    assert Job.objects.get(id=job.id).state == State.RELEASED
    rental.note_worker_alive(job_id=job.id, attempt=allocation.attempt, now=clock.now())
    seen = Job.objects.values_list("worker_seen_at", flat=True).get(id=job.id)
    assert abs(seen - rented - timedelta(minutes=10)) < timedelta(seconds=30)


@pytest.mark.parametrize("step_h", [3, -3], ids=["stepped_ahead", "stepped_back"])
def test_a_node_clock_stepped_between_two_beats_does_not_move_what_its_agent_dates(skewed_node, step_h):
    """The correction is measured at every beat, but a node's clock stepped between two beats (a time service
    starting, an operator's ``date -s``) moved every date its agent wrote until the next one: a part ending in
    that window was released 3 hours in the future, and its team billed for them (or its hours went unmetered).
    Between two measures the agent counts on a clock that is never stepped."""
    skewed_node(timedelta(0))  # measured at a beat
    stepped = time_machine.travel(datetime.now(UTC) + timedelta(hours=step_h), tick=True)
    stepped.start()  # no beat since
    try:
        assert abs(timezone.now() - _database_now() - timedelta(hours=step_h)) < timedelta(seconds=2)
        assert abs(clock.now() - _database_now()) < timedelta(seconds=2)
    finally:
        stepped.stop()
