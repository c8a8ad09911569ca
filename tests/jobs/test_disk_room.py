"""The scheduler counts each node's disk: the agent measures at every beat what its disk can still give
attempt spaces, and the snapshot takes off the spaces of parts placed since, which that measure cannot
hold yet. A job goes to a node whose disk holds its space, not to one that would refuse it."""

import shutil
from datetime import timedelta

import pytest
from django.utils import timezone

from common import schema
from jobs import limits, nodes, rental, scheduler, snapshot
from jobs.management.commands import node_agent
from jobs.models import Node
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db
GB = 10**9


def test_a_beat_records_what_the_nodes_disk_can_still_give():
    NodeFactory(name="gpu-01")
    now = timezone.now()
    assert nodes.heartbeat(name="gpu-01", now=now, disk_free=30 * GB)
    node = Node.objects.get(name="gpu-01")
    assert (node.disk_free_bytes, node.disk_free_at) == (30 * GB, now)
    # Not measured this time (its disk could not be read): no old figure is kept.
    assert nodes.heartbeat(name="gpu-01", now=now + timedelta(seconds=5), disk_free=None)
    node = Node.objects.get(name="gpu-01")
    assert (node.disk_free_bytes, node.disk_free_at) == (None, None)


def test_an_agent_registering_again_measures_its_disk_anew():
    now = timezone.now()
    node = NodeFactory(name="gpu-01", disk_free_bytes=30 * GB, disk_free_at=now)
    nodes.register_node(
        name="gpu-01",
        gpus=4,
        gpu_model="virtual",
        address="h",
        agent_version=schema.code().version,
        sandbox="bubblewrap",
        now=now,
    )
    node.refresh_from_db()
    assert (node.disk_free_bytes, node.disk_free_at) == (None, None)


def test_the_snapshot_takes_off_the_spaces_of_parts_placed_since_the_disk_was_measured(settings):
    settings.E31_SCRATCH_BYTES, settings.E31_LOG_CAP_BYTES = GB, 10**8
    now = timezone.now()
    NodeFactory(name="gpu-01", disk_free_bytes=30 * GB, disk_free_at=now - timedelta(seconds=60))
    made, placed, just, queued = (JobFactory(output_bytes=n * GB) for n in (1, 2, 3, 1))
    for gpu, job in enumerate((made, placed, just)):
        assert rental.rent_job(
            job_id=job.id, gpus_by_node={"gpu-01": (gpu,)}, now=now - timedelta(seconds=300)
        )
    made.allocations.update(
        started_at=now - timedelta(seconds=200)
    )  # its space was on the disk when measured
    just.allocations.update(started_at=now - timedelta(seconds=90))  # 30 s before the measure: maybe not yet
    pool = snapshot.take(now=now)
    assert pool.nodes[0].free_disk == 30 * GB - limits.space_bytes(2 * GB) - limits.space_bytes(3 * GB)
    wanted = GB + GB + 10**8  # output, scratch, log
    assert limits.space_bytes(GB) == wanted + wanted // 20 + 8 * 2**20  # and the filesystem's own tables
    assert [(p.job_id, p.space) for p in pool.pending] == [(queued.id, limits.space_bytes(GB))]


def test_a_node_that_has_not_measured_its_disk_is_not_limited_by_it():
    NodeFactory(name="gpu-01")
    assert snapshot.take(now=timezone.now()).nodes[0].free_disk is None


def test_the_scheduler_passes_over_a_node_whose_disk_cannot_hold_the_jobs_space():
    now = timezone.now()
    NodeFactory(name="gpu-01", disk_free_bytes=GB, disk_free_at=now)
    NodeFactory(name="gpu-02", disk_free_bytes=100 * GB, disk_free_at=now)
    job = JobFactory(output_bytes=GB)
    scheduler.run_pass(now=now)
    assert job.allocations.get().node.name == "gpu-02"


@pytest.mark.parametrize(
    ("label", "jobs_dir", "measured"),
    [
        ("memory, cpu, pids; disk bounded", "gpu-01/jobs", True),
        ("memory, cpu, pids", "gpu-01/jobs", False),
        (
            "memory, cpu, pids; disk bounded",
            "elsewhere",
            False,
        ),  # its jobs directory cannot be read: no figure
    ],
)
def test_the_agent_measures_its_disk_at_every_beat_where_it_bounds_attempt_spaces(
    settings, tmp_path, monkeypatch, label, jobs_dir, measured
):
    settings.E31_AGENT_ROOT, settings.E31_HEARTBEAT_S = tmp_path, 0.01
    (tmp_path / jobs_dir).mkdir(parents=True)
    stop, beats = node_agent.threading.Event(), []

    def beat(**kwargs):
        beats.append(kwargs["disk_free"])
        stop.set()
        return True

    monkeypatch.setattr(nodes, "heartbeat", beat)
    give_up = node_agent.threading.Timer(
        5, stop.set
    )  # a beat that fails is retried for ever: not in this test
    give_up.start()
    try:
        node_agent._heartbeat({"name": "gpu-01", "host_id": "machine-a", "limits": label}, stop)
    finally:
        give_up.cancel()
    if measured:
        assert abs(beats[0] - shutil.disk_usage(tmp_path).free) < 10**8
    else:
        assert beats == [None]


def test_an_agent_registers_what_its_disk_holds_in_all_and_a_larger_space_is_told_it_never_fits(settings):
    settings.E31_SCRATCH_BYTES, settings.E31_LOG_CAP_BYTES = GB, 0
    now = timezone.now()
    fields = {
        "gpus": 8,
        "gpu_model": "virtual",
        "address": "h",
        "agent_version": schema.code().version,
        "sandbox": "bubblewrap",
    }
    nodes.register_node(name="gpu-01", now=now, disk_bytes=100 * GB, **fields)  # first in node order
    nodes.register_node(name="gpu-02", now=now, disk_bytes=200 * GB, **fields)
    assert {n.name: n.disk for n in snapshot.take(now=now).nodes} == {"gpu-01": 100 * GB, "gpu-02": 200 * GB}
    for name, free in (("gpu-01", 100 * GB), ("gpu-02", 200 * GB)):
        nodes.heartbeat(name=name, now=now, disk_free=free)
    huge, fits = JobFactory(output_bytes=300 * GB), JobFactory(output_bytes=150 * GB)
    scheduler.run_pass(now=now)
    huge.refresh_from_db()
    assert huge.state == "queued" and not huge.allocations.exists()
    assert huge.estimated_start is None and "larger than any node's disk" in huge.pending_reason
    assert "the largest holds 200.0 GB" in huge.pending_reason
    assert fits.allocations.get().node.name == "gpu-02"


@pytest.mark.parametrize(
    ("label", "jobs_dir", "said"),
    [
        ("memory, cpu, pids; disk bounded", "gpu-01/jobs", True),
        ("memory, cpu, pids", "gpu-01/jobs", False),  # it bounds no space: nothing to refuse
        ("memory, cpu, pids; disk bounded", "elsewhere", False),  # its jobs directory cannot be read
    ],
)
def test_an_agent_says_what_its_disk_holds_only_where_it_bounds_attempt_spaces(
    tmp_path, label, jobs_dir, said
):
    (tmp_path / jobs_dir).mkdir(parents=True)
    size = limits.disk_size(tmp_path / "gpu-01" / "jobs", label)
    assert size == (shutil.disk_usage(tmp_path).total if said else 0)


def test_a_rent_does_not_land_on_a_node_held_for_its_disk_after_the_snapshot(monkeypatch):
    """gpu-01's agent reports that its disk could not hold an attempt's space (``hold_for_room``) just after
    the pass read the pool. The RENT re-checks the node (up, GPUs present) under its row lock, as it does for a
    drain, yet places the job on gpu-01 anyway, so the job's space is refused there and the attempt is
    wasted; gpu-02, taking work, was free for it next pass."""
    now = timezone.now()
    held = NodeFactory(name="gpu-01", gpus=4)
    NodeFactory(name="gpu-02", gpus=4)
    job = JobFactory(gpus=1, hours=1.0)
    take = snapshot.take

    def read_then_disk_fills(*, now):
        view = take(now=now)
        nodes.hold_for_room(node_id=held.id, now=now)  # the agent's report commits after the read
        return view

    monkeypatch.setattr(snapshot, "take", read_then_disk_fills)
    scheduler.run_pass(now=now)

    job.refresh_from_db()
    assert not job.allocations.filter(node=held).exists(), "rented onto a node held for its disk"
    assert job.state == "queued"
