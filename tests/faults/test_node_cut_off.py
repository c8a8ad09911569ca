"""A node cut off from the database stops its jobs before the platform can give their GPUs to another attempt.

The platform declares a silent node lost E31_NODE_TIMEOUT_S after its last heartbeat and requeues its jobs;
a part that ran on through that (its agent unable to reach the database, its node otherwise fine) would run
beside the job's next attempt: two attempts at once, both writing the same checkpoint, one never metered.
"""

import subprocess
import time
from types import SimpleNamespace

import pytest
from django.db import OperationalError
from django.utils import timezone

from jobs import agent, rental
from jobs.lifecycle import EndReason, State
from jobs.models import Allocation, Job
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def compressed(settings):
    """Declared lost after 5 s of silence, a beat every 0.5 s, 1 s to die at TERM (checks every second)."""
    settings.E31_NODE_TIMEOUT_S, settings.E31_HEARTBEAT_S, settings.E31_KILL_GRACE_S = 5.0, 0.5, 1.0


def _cut_off(*args, **kwargs):
    raise OperationalError("could not connect to server: Connection timed out")


def _watched(monkeypatch, check) -> tuple[str, float]:
    """Watches a 20-second process with ``check`` standing in for the database checks; (reason, seconds)."""
    monkeypatch.setattr(agent, "_check", check)
    proc = subprocess.Popen(["sleep", "20"])
    try:
        began = time.monotonic()
        return agent._watch(None, proc, None), time.monotonic() - began
    finally:
        proc.kill()
        proc.wait()


def test_a_part_cut_off_from_the_database_stops_before_its_node_can_be_declared_lost(compressed, monkeypatch):
    # Declared lost 5 s after its last beat, which may precede the last good check by 0.5 s; the fence is seen at
    # the next check (1 s later at most) and stopping takes up to 1 s more.
    assert agent.fence_after_s() == pytest.approx(2.5)
    reason, took = _watched(monkeypatch, _cut_off)
    assert reason == agent.FENCED, "it ran on although its node could be declared lost and its GPUs rented"
    assert 2.5 <= took and took + 1.0 <= 5.0 - 0.5


def test_a_database_restart_shorter_than_the_fence_does_not_stop_the_part(compressed, monkeypatch):
    """Out of reach for 1.5 s, then back: the part runs on (and is stopped here by its own end)."""
    down_until = time.monotonic() + 1.5
    checks = []

    def restarting(*args, **kwargs):
        checks.append(time.monotonic())
        if time.monotonic() < down_until:
            raise OperationalError("the database system is starting up")
        return "cancelled" if len(checks) > 4 else ""

    reason, _took = _watched(monkeypatch, restarting)
    assert reason == "cancelled"  # the checks went on after the restart: the fence never fired


def test_a_fenced_part_whose_node_was_not_declared_lost_requeues_its_job(pool, team):
    """The database came back before the reaper declared the node lost: the part the agent stopped is released as
    lost to its node, not as the job's failure, and the job goes back to the queue for its next attempt."""
    job = JobFactory(team=team, gpus=1, requeue=True)
    now = timezone.now()
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=now)
    part = Allocation.objects.get(job=job)
    assert rental.start_allocation(allocation_id=part.id, now=now)
    part.refresh_from_db()
    seen = SimpleNamespace(
        job=Job.objects.get(id=job.id), allocation=part, rank=0, num_nodes=1, node=part.node
    )

    agent._after_exit(seen, None, agent.FENCED, -15)

    job.refresh_from_db()
    part.refresh_from_db()
    assert (job.state, job.attempt, job.lost_attempts) == (State.QUEUED, 1, 1)
    assert part.released_at is not None and part.end_reason == EndReason.NODE_LOST
    assert job.events.filter(reason__contains="could not reach the platform").exists()
