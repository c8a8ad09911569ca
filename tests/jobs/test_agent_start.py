"""The start of a part: whatever fails between its start and its process, the GPUs are released."""

import os
import subprocess
import threading
import time
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.utils import timezone

from accounts import team_secrets
from jobs import agent, attempt_space, limits, rental, sandbox, scheduler, snapshot
from jobs.models import GpuHold, Job, JobEvent, Node
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


@pytest.fixture
def small_disk(settings, tmp_path):
    """The agent's root on a 32 MiB disk, and attempts that ask for 64 MB of scratch."""
    settings.E31_SCRATCH_BYTES = 64 * 10**6
    settings.E31_AGENT_ROOT = tmp_path / "agents"  # as ``rented`` has it
    settings.E31_AGENT_ROOT.mkdir(parents=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(settings.E31_AGENT_ROOT)], check=True
    )
    try:
        yield
    finally:
        attempt_space.release_all(settings.E31_AGENT_ROOT)
        subprocess.run(["umount", "--lazy", str(settings.E31_AGENT_ROOT)], check=True)


@pytest.fixture
def ext4_disk(settings, tmp_path):
    """The agent's root on a 32 MiB ext4 disk (no journal, no blocks kept for root), as a node's disk is: unlike a
    tmpfs, ext4 keeps what a failed fallocate took, so a refused space leaves the disk full for a moment."""
    settings.E31_AGENT_ROOT = tmp_path / "agents"  # as ``rented`` has it
    settings.E31_AGENT_ROOT.mkdir(parents=True)
    image = tmp_path / "disk.img"
    with image.open("wb") as disk:
        disk.truncate(32 * 2**20)
    subprocess.run([*attempt_space.MKFS, str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(settings.E31_AGENT_ROOT)], check=True)
    try:
        yield
    finally:
        attempt_space.release_all(settings.E31_AGENT_ROOT)
        subprocess.run(["umount", "--lazy", str(settings.E31_AGENT_ROOT)], check=True)


def test_a_space_the_nodes_disk_cannot_hold_sends_the_job_back_to_the_queue_with_the_reason(
    rented, small_disk, settings
):
    settings.E31_MAX_ATTEMPTS = 2
    _run(rented)
    assert rented.state == "queued" and not GpuHold.objects.filter(active=True).exists()
    requeued = JobEvent.objects.get(job=rented, to_state="queued", from_state="running").reason
    assert "no room on the node's disk" in requeued and "bytes" in requeued
    assert "free" not in requeued  # the node's own figures stay in its log


def test_on_its_last_attempt_a_job_the_nodes_disk_cannot_hold_ends_failed_saying_why(
    rented, small_disk, settings
):
    settings.E31_MAX_ATTEMPTS = 1
    _run(rented)
    assert (rented.state, rented.end_reason) == ("released", "failed")
    assert rented.end_detail.startswith("no room on the node's disk: this attempt's space needs")
    assert not GpuHold.objects.filter(active=True).exists()


def test_a_node_says_at_start_when_its_disk_holds_fewer_attempt_spaces_than_it_has_gpus(small_disk, settings):
    settings.E31_SCRATCH_BYTES, settings.E31_LOG_CAP_BYTES = 0, 10**6  # spaces of the smallest size, 16 MiB
    assert limits.disk_shortfall(settings.E31_AGENT_ROOT, 2) == ""
    shortfall = limits.disk_shortfall(settings.E31_AGENT_ROOT, 3)
    assert "room for 2 attempt space(s) of 16.8 MB" in shortfall and "for 3 GPU(s)" in shortfall


def test_an_attempt_whose_job_never_ran_gives_its_whole_space_back_at_once(rented, monkeypatch):
    """Not at the retention sweep a day later: a job made to fail at its start must not hold the node's disk."""

    def unavailable(**_):
        raise team_secrets.SecretsUnavailable("API_KEY is no longer set")

    monkeypatch.setattr(team_secrets, "values_for_attempt", unavailable)
    _run(rented)
    assert (rented.state, rented.end_reason) == ("released", "failed")
    root = sandbox.attempt_dirs(rented.allocations.get()).root
    assert not os.path.ismount(root) and not (root / attempt_space.IMAGE).exists()


def test_a_node_label_long_enough_to_be_cut_still_says_its_disk_is_bounded(monkeypatch, settings, tmp_path):
    # The pool keeps 200 characters of it, and the agent refuses an unbounded space by finding the disk part.
    from jobs.management.commands import node_agent

    settings.E31_AGENT_ROOT = tmp_path / "agents"
    monkeypatch.setattr(limits, "probe", lambda name: "none: " + "a reason with a long cgroup path " * 8)
    monkeypatch.setattr(limits, "probe_space", lambda jobs_dir: "")
    label = node_agent._limits("gpu-01")
    assert len(label) <= 200 and label.startswith("none: a reason")
    assert label.endswith(limits.DISK_BOUNDED)


def test_a_job_sent_back_for_room_is_queued_only_once_its_attempt_has_settled(
    rented, small_disk, settings, monkeypatch
):
    # Queued first, it could be placed again (on this node too) while this attempt still unmounted its
    # checkpoint and gave back its uid and space: the next attempt's checkpoint would go with them.
    settings.E31_MAX_ATTEMPTS = 2
    settle = agent._settle_space
    seen = []

    def watched(dirs, *, ran):
        seen.append(Job.objects.get(id=rented.id).state)
        settle(dirs, ran=ran)

    monkeypatch.setattr(agent, "_settle_space", watched)
    _run(rented)
    assert seen == ["running"] and rented.state == "queued"


def test_a_node_whose_disk_could_not_hold_a_space_takes_no_new_work_for_a_while(rented, ext4_disk, settings):
    # Else the scheduler hands the requeued job (and the next) straight back to the same full node, and each
    # bounce spends one of the job's attempts.
    settings.E31_MAX_ATTEMPTS, settings.E31_NO_ROOM_HOLD_S = 3, 300
    # A 23.6 MB space: the 32 MiB disk would hold it, were 16 MB of it not taken.
    settings.E31_SCRATCH_BYTES = 4 * 10**6
    (settings.E31_AGENT_ROOT / "taken").write_bytes(bytes(16 * 10**6))
    NodeFactory(name="gpu-02")
    _run(rented)
    now = timezone.now()
    assert Node.objects.get(name="gpu-01").no_room_until > now + timedelta(seconds=290)
    assert {n.name: n.schedulable for n in snapshot.take(now=now).nodes} == {"gpu-01": False, "gpu-02": True}
    scheduler.run_pass(now=now)
    assert rented.allocations.order_by("-attempt").first().node.name == "gpu-02"
    Node.objects.update(last_heartbeat=now + timedelta(seconds=300))  # both agents still beat
    later = snapshot.take(now=now + timedelta(seconds=301))
    assert {n.name: n.schedulable for n in later.nodes} == {"gpu-01": True, "gpu-02": True}


@pytest.mark.parametrize(
    ("output_bytes", "taken", "says"),
    [
        (100 * 10**6, 0, "the node's disk holds 30.7 MB in all"),  # more than the whole disk
        (5 * 10**6, 5 * 10**6, ""),  # the disk holds it in all, but a smaller space still fits what is free
    ],
)
def test_a_space_too_large_for_a_disk_that_still_has_room_for_others_does_not_hold_the_node(
    rented, ext4_disk, settings, output_bytes, taken, says
):
    # The hold is for a node that can take no attempt at all. Held for one job's declaration, a node would be
    # out of the pool at each of its attempts: a tenant's few such jobs, the whole pool for minutes at a time.
    settings.E31_MAX_ATTEMPTS, settings.E31_NO_ROOM_HOLD_S = 3, 300
    settings.E31_SCRATCH_BYTES = (
        4 * 10**6
    )  # a space with no output is 23.6 MB: the 32 MiB disk has room for it
    (settings.E31_AGENT_ROOT / "taken").write_bytes(bytes(taken))
    Job.objects.filter(id=rented.id).update(output_bytes=output_bytes)
    _run(rented)
    assert rented.state == "queued" and not GpuHold.objects.filter(active=True).exists()
    assert Node.objects.get(name="gpu-01").no_room_until is None
    requeued = JobEvent.objects.get(job=rented, to_state="queued", from_state="running").reason
    assert requeued.startswith("requeued: no room on the node's disk: this attempt's space needs"), requeued
    assert says in requeued and ("in all" in requeued) == bool(says)


def test_a_clean_up_step_that_fails_leaves_the_others_done(rented, monkeypatch):
    # A group that would not go (its last process stuck in the kernel) must not leave the attempt's devices
    # group behind, nor its files owned by a job uid the next attempt, of any team, may be given.
    done = []

    class StuckGroup:
        def procs_files(self):
            return []

        def remove(self):
            raise OSError(16, "Device or resource busy")

    monkeypatch.setattr(limits, "open_group", lambda allocation: StuckGroup())
    monkeypatch.setattr(agent, "_run_bounded", lambda *args: ("succeeded", 0))
    monkeypatch.setattr(agent.devices, "release", lambda key: done.append("devices"))
    monkeypatch.setattr(sandbox, "reown", lambda root: done.append("reown"))
    _run(rented)
    assert done == ["devices", "reown"]
    assert (rented.state, rented.end_reason) == ("released", "failed")
    assert "Device or resource busy" in rented.end_detail


def test_a_clean_up_step_that_fails_after_no_room_still_sends_the_job_back_for_room(
    rented, monkeypatch, settings
):
    # The shortage is the store's: a clean-up error raised on top of it must not turn it into the job's failure
    # (ended failed, its attempt spent). A full checkpoint store, which every node may share, holds no node.
    settings.E31_MAX_ATTEMPTS, settings.E31_NO_ROOM_HOLD_S = 2, 300
    Job.objects.filter(id=rented.id).update(
        preemptible=True, checkpoint_signal="USR1", checkpoint_grace_s=30, checkpoint_bytes=10**6
    )

    def no_room(job_id, *, owner, limit):
        raise attempt_space.NoRoom(
            limit,
            0,
            store="the checkpoint store",
            space="the job's checkpoint space",
            made_of="its checkpoint",
        )

    def stuck(root):
        raise OSError(16, "Device or resource busy")

    monkeypatch.setattr(limits, "bound_space", lambda root, job: True)
    monkeypatch.setattr(agent.checkpoints, "prepare", no_room)
    monkeypatch.setattr(agent.checkpoints, "settle", lambda job_id, limit: agent.checkpoints.Kept(0))
    monkeypatch.setattr(sandbox, "reown", stuck)
    _run(rented)
    assert rented.state == "queued" and not GpuHold.objects.filter(active=True).exists()
    assert "no room on the checkpoint store: the job's checkpoint space" in rented.events.latest("id").reason
    assert Node.objects.get(name="gpu-01").no_room_until is None


def test_a_part_whose_network_cannot_be_planned_does_not_leave_its_attempt_running_with_no_process(pool):
    """A part of a job spanning nodes on GPU index 64 or above has no address in its node's /24: loading the part
    fails after the part was claimed (the job RUNNING, metered), and the attempt is released, saying why."""
    big = NodeFactory(name="gpu-big", gpus=72)
    for slot, node in enumerate((pool[0], big)):  # as registration gives them
        Node.objects.filter(id=node.id).update(network_slot=slot)
    job = JobFactory(gpus=2)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,), "gpu-big": (64,)}, now=timezone.now())

    agent.run_part(allocation_id=job.allocations.get(rank=1).id, mode=sandbox.BUBBLEWRAP, uids=None)
    job.refresh_from_db()
    assert (job.state, job.end_reason) == ("released", "failed")
    assert job.end_detail.startswith("the node agent could not prepare it: ")
    assert not GpuHold.objects.filter(allocation__job=job, active=True).exists()


def test_a_team_reads_that_the_agent_failed_but_not_the_nodes_paths(pool, team, monkeypatch):
    """The error names a file in the node's own state folder: the team reads what went wrong and where operators
    find the rest, not the node's paths (they stay in its log)."""
    job = JobFactory(team=team, gpus=1)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=timezone.now())
    part = job.allocations.get()

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device", "/var/lib/e31/agents/gpu-01/attempts/17-1/job.log")

    monkeypatch.setattr(agent, "_bound_or_refuse", broken)
    agent.run_part(allocation_id=part.id, mode=sandbox.UNSANDBOXED, uids=None)
    job.refresh_from_db()
    assert (job.state, job.end_reason) == ("released", "failed")
    assert job.end_detail == (
        f"the node agent failed: No space left on device (the node's log has it under allocation {part.id})"
    )


def _stopping_part_on_gpu_0(seconds: float) -> tuple[threading.Thread, list[float]]:
    """A released part of this node whose process takes ``seconds`` to stop, on GPU 0; and when it stopped."""
    holding, stopped = threading.Event(), []

    def stopping() -> None:
        with agent.LOCAL_GPUS.using("gpu-01", (0,), 999, wait_s=0):
            holding.set()
            time.sleep(seconds)
            stopped.append(time.time())

    thread = threading.Thread(target=stopping)
    thread.start()
    holding.wait(5)
    return thread, stopped


def test_a_part_rented_onto_a_gpu_whose_last_process_is_still_stopping_starts_once_it_has_stopped(
    rented, monkeypatch, tmp_path
):
    """A part released from outside (its node declared lost while its agent lived, or set down and up again) frees
    its GPUs at once while its process still has its kill grace: a job rented onto them started beside it."""
    monkeypatch.setattr(limits, "bound_space", lambda root, job: True)
    stamp = tmp_path / "started"
    Job.objects.filter(id=rented.id).update(argv=["sh", "-c", f"date +%s.%N > {stamp}"])
    stopping, stopped = _stopping_part_on_gpu_0(1.0)
    _run(rented)
    stopping.join()
    assert rented.state == "released" and rented.end_reason == "succeeded", rented.end_detail
    assert float(stamp.read_text()) >= stopped[0]  # started once the other process had stopped


def test_a_gpu_whose_last_process_never_stops_sends_the_part_back_to_the_queue_spending_no_attempt(
    rented, monkeypatch, settings
):
    """The overlap is the platform's, not the job's: even on its last attempt the job goes back to the queue, no
    attempt counted, told which GPU was busy (not which allocation held it); the node takes no new work a while."""
    monkeypatch.setattr(limits, "bound_space", lambda root, job: True)
    settings.E31_KILL_GRACE_S = 0.1  # waits 2 x 0.1 s + two checks
    settings.E31_MAX_ATTEMPTS = 3
    Job.objects.filter(id=rented.id).update(requeue=True, lost_attempts=2)
    stopping, _ = _stopping_part_on_gpu_0(4.0)
    _run(rented)
    stopping.join()
    assert (rented.state, rented.lost_attempts) == ("queued", 2), (rented.state, rented.end_detail)
    assert not GpuHold.objects.filter(active=True).exists()
    said = JobEvent.objects.filter(job=rented).order_by("-id").values_list("reason", flat=True).first()
    assert said == "retried: not started: GPU 0 of gpu-01 was still in use by a process that was stopping"
    assert Node.objects.get(name="gpu-01").no_room_until > timezone.now()


@pytest.mark.django_db(
    transaction=True
)  # the agent closes a connection the database refused, as in production
def test_a_database_restart_while_a_part_is_prepared_does_not_fail_the_job(rented, monkeypatch):
    """The part's rows are read just after it is claimed: a database restarting at that moment (one refused read)
    failed the job, an attempt lost to the platform's own hiccup. It is read again once the database is back."""
    load, refusals = agent._load_part, []

    def restarting(*args, **kwargs):
        if not refusals:
            refusals.append(1)
            raise OperationalError("the database system is starting up")
        return load(*args, **kwargs)

    monkeypatch.setattr(agent, "_load_part", restarting)
    monkeypatch.setattr(
        limits, "bound_space", lambda root, job: True
    )  # no loop mount left behind by a success
    _run(rented)
    assert refusals, "the part was never read"
    assert (rented.state, rented.end_reason) == ("released", "succeeded"), rented.end_detail


def test_an_agent_never_starts_another_nodes_part(rented):
    """A run message reaching the wrong node's agent (misrouted, or put on its queue by hand) would run another
    node's part on this machine's GPUs, beside whatever this node placed there: it is not claimed here."""
    allocation = rented.allocations.get()
    agent.run_part(allocation_id=allocation.id, mode=sandbox.UNSANDBOXED, uids=None, node_name="gpu-02")

    allocation.refresh_from_db()
    rented.refresh_from_db()
    assert allocation.started_at is None and rented.state == "rented"


def test_a_part_released_while_it_is_prepared_never_starts_its_process(rented, monkeypatch, tmp_path):
    """A part released from outside while its agent prepared it (its node set down, the reconciler taking a long
    preparation for a silent agent) launched its process all the same: after its RELEASE, unmetered, on GPUs that
    may already be another team's. Nothing of it runs now, and its claim counts as a sign of life."""
    monkeypatch.setattr(limits, "bound_space", lambda root, job: True)
    stamp = tmp_path / "ran"
    Job.objects.filter(id=rented.id).update(argv=["sh", "-c", f"touch {stamp}"])
    real_using = agent.LOCAL_GPUS.using

    def released_meanwhile(*args, **kwargs):
        assert Job.objects.get(id=rented.id).worker_seen_at is not None  # the claim: a sign of life
        rental.release_job(job_id=rented.id, end_reason="node_lost", now=timezone.now(), actor="reconciler",
                           detail="its node agent stopped reporting on it")  # fmt: skip
        return real_using(*args, **kwargs)

    monkeypatch.setattr(agent.LOCAL_GPUS, "using", released_meanwhile)
    _run(rented)
    assert not stamp.exists(), "the process started after its part was released"
    assert (rented.state, rented.end_reason) == ("released", "node_lost")
    assert not GpuHold.objects.filter(active=True).exists()
