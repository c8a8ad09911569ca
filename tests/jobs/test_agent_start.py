"""The start of a part: whatever fails between its start and its process, the GPUs are released."""

import subprocess

import pytest
from django.utils import timezone

from jobs import agent, attempt_space, limits, rental, sandbox
from jobs.models import GpuHold
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def rented(settings, tmp_path):
    settings.E31_AGENT_ROOT = tmp_path / "agents"
    node = NodeFactory(name="gpu-01", limits="memory, cpu, pids; disk bounded")
    job = JobFactory()
    assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: (0,)}, now=timezone.now())
    return job


def _run(job, uids=None):
    agent.run_part(allocation_id=job.allocations.get().id, mode=sandbox.UNSANDBOXED, uids=uids)
    job.refresh_from_db()


def _hung(*cmd):
    raise subprocess.TimeoutExpired(cmd, 60)


def test_a_hung_mount_is_an_unbounded_space_not_an_escape(tmp_path, monkeypatch):
    monkeypatch.setattr(attempt_space, "_run", _hung)
    assert attempt_space.bound(tmp_path / "attempt", size=attempt_space.MIN_BYTES) is False


def test_a_node_that_advertises_a_disk_bound_ends_the_attempt_when_it_cannot_mount_one(rented, monkeypatch):
    monkeypatch.setattr(attempt_space, "_run", _hung)
    _run(rented)
    assert (rented.state, rented.end_reason) == ("released", "failed")
    assert "disk bound" in rented.end_detail
    assert not GpuHold.objects.filter(active=True).exists()


def test_running_out_of_job_uids_releases_the_gpus(rented, monkeypatch):
    class Exhausted:
        def take(self, seed):
            raise RuntimeError("all 4 job uids are in use on this node")

        def give_back(self, uid):
            raise AssertionError("nothing was taken")

    monkeypatch.setattr(limits, "bound_space", lambda root, job: True)
    monkeypatch.setattr(agent.os, "geteuid", lambda: 0)
    _run(rented, uids=Exhausted())
    assert (rented.state, rented.end_reason) == ("released", "failed")
    assert "job uids" in rented.end_detail
    assert not GpuHold.objects.filter(active=True).exists()
