"""A pausable job's checkpoint directory: the one thing of a job that outlives its attempt.

It lives under ``E31_CHECKPOINT_ROOT`` (beside the staging area, off the meter, never in an attempt's
bounded space, which is removed after its retention), one directory per job, mode 0700. Each attempt's
first part gets it owned by its own uid and bound in as ``$E31_CHECKPOINT_DIR``; when the attempt ends
it is the agent's again (setuid bits cleared), measured against the declared ``checkpoint.bytes`` and
handed to the next attempt, possibly on another node: a pool spanning machines mounts the root from
storage every node shares. A checkpoint past its bound is removed whole, so the next attempt starts
from scratch rather than from a checkpoint cut short. When the job ends, however, the directory goes.
"""

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from jobs import sandbox
from jobs.units import format_size


def directory(job_id: int) -> Path:
    return settings.E31_CHECKPOINT_ROOT / str(job_id)


def prepare(job_id: int, *, owner: int) -> Path:
    """The job's directory, made if new, re-owned by this attempt's uid; others cannot list the root."""
    root = settings.E31_CHECKPOINT_ROOT
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o711)  # job uids pass through to their own directory, and see no other job's
    path = directory(job_id)
    path.mkdir(mode=0o700, exist_ok=True)
    path.chmod(0o700)
    for entry in (path, *path.rglob("*")):
        os.lchown(entry, owner, owner)
    return path


def held_bytes(path: Path) -> int:
    """Bytes in regular files under ``path``, never following links."""
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            info = (Path(folder) / name).lstat()
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return total


@dataclass(frozen=True)
class Kept:
    bytes: int  # what the next attempt is handed (0: nothing)
    note: str = ""  # why what the job saved was not kept


def settle(job_id: int, *, limit: int) -> Kept:
    """After an attempt: the directory is the agent's again and within ``limit``, or emptied with a note."""
    path = directory(job_id)
    if not path.is_dir():
        return Kept(0)
    sandbox.reown(path)
    size = held_bytes(path)
    if size <= limit:
        return Kept(size)
    empty(path)
    return Kept(
        0,
        f"its checkpoint of {format_size(size)} was over its declared checkpoint.bytes ({format_size(limit)}) "
        "and was removed: the next attempt starts from scratch",
    )


def empty(path: Path) -> None:
    for entry in list(path.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def remove(job_id: int) -> None:
    shutil.rmtree(directory(job_id), ignore_errors=True)


def stored_job_ids() -> list[int]:
    root = settings.E31_CHECKPOINT_ROOT
    if not root.is_dir():
        return []
    return [int(entry.name) for entry in root.iterdir() if entry.name.isdigit()]
