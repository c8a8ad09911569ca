"""The node's sweep of old attempt directories: whatever one job left, every expired attempt goes."""

import os
import subprocess
from pathlib import Path

import pytest
from django.utils import timezone

from jobs import agent, attempt_space, trees

pytestmark = pytest.mark.django_db


def nest(path: Path, depth: int) -> None:
    """``depth`` directories, one inside the other, made by descriptor (no path is ever that long)."""
    path.mkdir(parents=True)
    fd = os.open(path, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)


@pytest.fixture(autouse=True)
def _no_deep_tree_left(tmp_path):
    """Whatever the code under test did: pytest's own clean-up (shutil.rmtree) would fail on a deep tree."""
    yield
    trees.remove_tree(*tmp_path.iterdir())


def expired_attempts(settings, tmp_path, count: int) -> list[Path]:
    """Attempt directories with no allocation on record: expired, whoever's they were."""
    settings.E31_AGENT_ROOT = tmp_path
    jobs = tmp_path / "n1" / "jobs"
    made = []
    for i in range(count):
        (jobs / f"{900_000 + i}-1" / "output").mkdir(parents=True)
        (jobs / f"{900_000 + i}-1" / "output" / "results").write_text("a team's results")
        made.append(jobs / f"{900_000 + i}-1")
    return made


def test_a_tree_nested_past_pythons_recursion_limit_keeps_no_attempt_from_being_removed(settings, tmp_path):
    """Reproduction: a job nested 1,100 directories; shutil.rmtree raised RecursionError (ignore_errors or not)
    and the sweep stopped there, every time, leaving the other teams' expired attempts on the disk."""
    attempts = expired_attempts(settings, tmp_path, 8)
    nest(attempts[0] / "work", 1_100)
    removed = agent.remove_expired_attempts(node_name="n1", now=timezone.now())
    assert sorted(removed) == sorted(a.name for a in attempts)
    assert not any(a.exists() for a in attempts)


def test_one_attempt_that_cannot_be_released_does_not_keep_the_others(settings, tmp_path, monkeypatch):
    attempts = expired_attempts(settings, tmp_path, 4)
    stuck = attempts[1]
    real_release = attempt_space.release

    def release(root: Path) -> None:
        if root == stuck:
            raise OSError("umount: target is busy")
        real_release(root)

    monkeypatch.setattr(attempt_space, "release", release)
    removed = agent.remove_expired_attempts(node_name="n1", now=timezone.now())
    assert sorted(removed) == sorted(a.name for a in attempts if a != stuck)
    assert stuck.exists() and not any(a.exists() for a in attempts if a != stuck)


def test_remove_tree_takes_any_depth_and_several_paths(tmp_path):
    nest(tmp_path / "deep", 3_000)
    (tmp_path / "flat").mkdir()
    trees.remove_tree(tmp_path / "deep", tmp_path / "flat", tmp_path / "missing")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs (root, as on CI)")
def test_an_attempt_rm_could_not_remove_is_not_counted_removed_and_goes_on_a_later_sweep(settings, tmp_path):
    """A mount inside an attempt (rm -rf --one-file-system never crosses one): the sweep used to count it removed."""
    attempts = expired_attempts(settings, tmp_path, 3)
    mounted = attempts[0] / "work" / "mnt"
    mounted.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mounted)], check=True)
    try:
        removed = agent.remove_expired_attempts(node_name="n1", now=timezone.now())
        assert sorted(removed) == sorted(a.name for a in attempts[1:])
        assert attempts[0].exists() and not any(a.exists() for a in attempts[1:])
    finally:
        subprocess.run(["umount", str(mounted)], check=True)
    assert agent.remove_expired_attempts(node_name="n1", now=timezone.now()) == [attempts[0].name]
    assert not attempts[0].exists()
