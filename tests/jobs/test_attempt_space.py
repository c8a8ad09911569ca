"""An attempt's writable space is a filesystem of its own, sized to its declaration: writing past it fails there."""

import errno
import os
import shutil
import subprocess

import pytest
from django.urls import reverse

from jobs import attempt_space, checkpoints

MB = 10**6


def test_the_size_covers_output_scratch_and_log_plus_the_filesystems_own_room():
    size = attempt_space.size_for(output_bytes=100 * MB, scratch_bytes=1000 * MB, log_bytes=10 * MB)
    assert 1110 * MB < size < 1110 * MB * 1.06 + 8 * 2**20 + 1
    assert attempt_space.size_for(output_bytes=1, scratch_bytes=0, log_bytes=0) == attempt_space.MIN_BYTES


def test_a_bounded_attempt_gets_no_space_past_its_size_and_release_leaves_nothing(tmp_path):
    root = tmp_path / "jobs" / "7-1"
    assert attempt_space.bound(
        root, size=attempt_space.size_for(output_bytes=MB, scratch_bytes=20 * MB, log_bytes=0)
    )
    assert os.path.ismount(root)
    with pytest.raises(OSError) as full, (root / "big").open("wb") as out:
        for _ in range(200):
            out.write(b"x" * MB)
    assert full.value.errno == errno.ENOSPC
    assert 20 * MB < (root / "big").stat().st_size < 40 * MB
    assert tmp_path.stat().st_dev != root.stat().st_dev  # the host's filesystem took none of it
    assert attempt_space.release_all(tmp_path) == [str(root)]
    assert not os.path.ismount(root) and os.listdir(root) == []


def test_the_mount_refuses_setuid_and_device_files(tmp_path):
    root = tmp_path / "7-2"
    assert attempt_space.bound(root, size=attempt_space.MIN_BYTES)
    try:
        options = next(line.split()[3] for line in open("/proc/self/mounts") if line.split()[1] == str(root))
        assert {"nosuid", "nodev"} <= set(options.split(","))
    finally:
        attempt_space.release(root)


MIB = 2**20


@pytest.fixture
def node_disk(tmp_path):
    """A node's disk of 128 MiB (a tmpfs), for what attempt spaces take of it together."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        attempt_space.release_all(disk)
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


def write(path, mib: int) -> None:
    """``mib`` MiB written and synced: a failure to store them raises here, not at some later writeback."""
    with path.open("wb") as out:
        for _ in range(mib):
            out.write(b"x" * MIB)
        out.flush()
        os.fsync(out.fileno())


def allocated(path) -> int:
    return path.stat().st_blocks * 512


def test_a_neighbour_filling_the_node_disk_takes_nothing_of_a_space_already_given(node_disk):
    """Sparse images let two spaces promise more than the disk holds: the one written last lost writes
    it was entitled to (EIO from its filesystem), through no fault of its own."""
    first, second = node_disk / "7-1", node_disk / "8-1"
    assert attempt_space.bound(first, size=48 * MIB)
    assert attempt_space.bound(second, size=48 * MIB)
    write(second / "big", 40)  # the neighbour uses all of its own
    with pytest.raises(OSError) as full:  # and the node's own files take whatever else is left
        write(node_disk / "node-file", 128)
    assert full.value.errno == errno.ENOSPC
    write(first / "mine", 40)  # still there in full for the first
    assert (first / "mine").stat().st_size == 40 * MIB


def test_a_space_the_disk_cannot_hold_is_refused_before_its_job_starts_and_leaves_nothing(node_disk):
    assert attempt_space.bound(node_disk / "7-1", size=80 * MIB)
    refused = node_disk / "8-1"
    with pytest.raises(attempt_space.NoRoom) as no_room:
        attempt_space.bound(refused, size=80 * MIB)
    assert "83,886,080 bytes" in str(no_room.value)  # what it needed, beside what the disk had
    assert not os.path.ismount(refused) and os.listdir(refused) == []
    write(node_disk / "node-file", 40)  # nothing of the refused space is held


def test_what_the_job_left_unused_goes_back_to_the_node_when_its_run_ends(node_disk):
    root = node_disk / "7-1"
    assert attempt_space.bound(root, size=64 * MIB)
    write(root / "kept", 8)
    write(root / "scratch", 30)
    (root / "scratch").unlink()
    held_before = shutil.disk_usage(node_disk).used
    attempt_space.give_back_unused(root)
    held_after = shutil.disk_usage(node_disk).used
    assert (
        held_before > 60 * MIB and held_after < 24 * MIB
    )  # 64 MiB held while it ran; about the 8 kept after
    assert (root / "kept").read_bytes() == b"x" * 8 * MIB


def test_a_finished_runs_scratch_goes_back_to_the_node_at_once_its_outputs_stay_for_delivery(node_disk):
    """The give-back returned only blocks the job never wrote: 30 MiB a job left in work/ (a 1.9 GB fallocate on
    the real size) stayed on the node's disk until the retention sweep, a day after delivery. Job after job of a
    second each took nodes' disks, and other teams' attempts were refused for room."""
    from jobs import agent, sandbox

    root = node_disk / "7-1"
    dirs = sandbox.AttemptDirs(root=root, work=root / "work", output=root / "output", data=root / "data")
    assert attempt_space.bound(root, size=64 * MIB)
    dirs.create(owner=os.geteuid())
    write(dirs.work / "pin", 30)
    write(dirs.output / "model.bin", 8)
    agent._settle_space(dirs, ran=True)
    assert shutil.disk_usage(node_disk).used < 24 * MIB  # the 8 MiB of output and the filesystem's own
    assert not dirs.work.exists()
    assert (dirs.output / "model.bin").read_bytes() == b"x" * 8 * MIB


def test_a_node_whose_disk_is_full_says_so_at_start_instead_of_failing(node_disk):
    write(node_disk / "node-file", 120)
    assert (
        attempt_space.probe(node_disk) == "attempt disk unbounded (its disk cannot hold even a 16 MiB space)"
    )
    assert os.listdir(node_disk) == ["node-file"]


def test_the_submit_form_says_the_jobs_space_is_held_for_it_on_the_nodes_disk(member_client, settings):
    settings.E31_SCRATCH_BYTES = 10 * 10**9
    page = member_client.get(reverse("jobs:new")).content.decode()
    section = page[page.index('id="where-jobs-run"') :]
    assert (
        "your declared output plus 10.0 GB of scratch, held for it on the node's disk from its start"
        in section
    )


def test_what_the_job_wrote_but_the_kernel_had_not_stored_yet_keeps_its_room_after_the_give_back(node_disk):
    """Data still in the page cache has no blocks yet: trimmed before it was written, it needed blocks
    again later, from a disk the node had filled by then."""
    root = node_disk / "7-1"
    assert attempt_space.bound(root, size=64 * MIB)
    with (root / "unsynced").open("wb") as out:
        for _ in range(40):
            out.write(b"x" * MIB)  # no fsync: the job exits with its last writes in the cache
    attempt_space.give_back_unused(root)
    with pytest.raises(OSError):
        write(node_disk / "node-file", 128)
    stored = os.open(root / "unsynced", os.O_RDONLY)
    try:
        os.fsync(stored)  # ENOSPC had the trim come first
    finally:
        os.close(stored)
    assert (root / "unsynced").read_bytes() == b"x" * 40 * MIB


def test_a_space_mounted_again_takes_back_what_it_gave_and_keeps_its_files(node_disk):
    """A checkpoint's space, from one attempt to the next: its image outside the directory it is mounted over."""
    root, image = node_disk / "checkpoint", node_disk / "checkpoint.img"
    assert attempt_space.bound(root, size=32 * MIB, image=image)
    write(root / "state", 4)
    attempt_space.give_back_unused(root)
    attempt_space.unmount(root)
    assert allocated(image) < 16 * MIB
    assert attempt_space.bound(root, size=32 * MIB, reuse=True, image=image)
    assert allocated(image) >= 32 * MIB and (root / "state").read_bytes() == b"x" * 4 * MIB


def test_a_checkpoint_space_the_disk_cannot_hold_is_named_so(node_disk, settings):
    settings.E31_CHECKPOINT_ROOT = node_disk / "checkpoints"
    with pytest.raises(attempt_space.NoRoom) as no_room:
        checkpoints.prepare(7, owner=os.getuid(), limit=200 * MIB)
    assert str(no_room.value).startswith("the job's checkpoint space needs")
    assert "(its declared checkpoint size)" in str(no_room.value)


def test_a_checkpoint_gives_back_what_its_job_left_unused_when_its_attempt_ends(node_disk, settings):
    # Its image keeps the job's declared checkpoint size while the job waits in the queue between attempts:
    # only the checkpoint it wrote should stay taken on the disk.
    settings.E31_CHECKPOINT_ROOT = node_disk / "checkpoints"
    path = checkpoints.prepare(7, owner=os.getuid(), limit=64 * MIB)
    write(path / "state", 4)
    kept = checkpoints.settle(7, limit=64 * MIB)
    assert kept.bytes >= 4 * MIB
    assert allocated(checkpoints.image(7)) < 24 * MIB


def test_the_unused_space_is_given_back_even_when_removing_the_scratch_times_out(monkeypatch, tmp_path):
    from jobs import agent, sandbox, trees

    root = tmp_path / "7-1"
    dirs = sandbox.AttemptDirs(root=root, work=root / "work", output=root / "output", data=root / "data")
    given_back = []

    def slow_rm(*paths):
        raise subprocess.TimeoutExpired(["rm"], 600)

    monkeypatch.setattr(trees, "remove_tree", slow_rm)
    monkeypatch.setattr(attempt_space, "give_back_unused", given_back.append)
    agent._settle_space(dirs, ran=True)  # logged, never raised: the retention sweep tries again
    assert given_back == [root]
