"""An attempt's writable space is a filesystem of its own, sized to its declaration: writing past it fails there."""

import errno
import os

import pytest

from jobs import attempt_space

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
