"""A pausable job's checkpoint directory: the one thing of a job that outlives its attempt.

It lives under ``E31_CHECKPOINT_ROOT`` (beside the staging area, off the meter, never in an attempt's
bounded space, which is removed after its retention), one directory per job, mode 0700. Each attempt's
first part gets it owned by its own uid and bound in as ``$E31_CHECKPOINT_DIR``; when the attempt ends
it is the agent's again (setuid bits cleared), measured against the declared ``checkpoint.bytes`` and
handed to the next attempt, possibly on another node: a pool spanning machines mounts the root from
storage every node shares. While an attempt runs the directory is a filesystem of its own (an image
under ``.images/``, the agent's alone, loop-mounted over it), so a job cannot write past its bound into
the node's disk, nor hand root an image of its making. A checkpoint past its bound is removed whole, so
the next attempt starts from scratch rather than from a checkpoint cut short. When the job ends, the
directory and its image go.
"""

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from jobs import attempt_space, sandbox, trees
from jobs.units import format_size

IMAGES = ".images"


def directory(job_id: int) -> Path:
    return settings.E31_CHECKPOINT_ROOT / str(job_id)


def image(job_id: int) -> Path:
    """Outside the directory it is mounted over: no job ever sees it, replaces it or links it elsewhere."""
    return settings.E31_CHECKPOINT_ROOT / IMAGES / f"{job_id}.img"


def prepare(job_id: int, *, owner: int, limit: int) -> Path:
    """The job's directory, made if new and bounded, owned by this attempt's uid; others cannot list the root.

    Bounded like an attempt's space, a filesystem sized to the declared ``limit``, its files kept from
    attempt to attempt. A mount found already there (a lost node's, on this machine) is never trusted: it
    is taken down and the image mounted afresh. Where this node cannot mount one, the directory is
    unbounded during the run and only measured after it (``bounded`` tells the agent).
    """
    root = settings.E31_CHECKPOINT_ROOT
    (root / IMAGES).mkdir(mode=0o700, parents=True, exist_ok=True)
    (root / IMAGES).chmod(0o700)
    root.chmod(0o711)  # job uids pass through to their own directory, and see no other job's
    path = directory(job_id)
    path.mkdir(mode=0o700, exist_ok=True)
    attempt_space.unmount(path)
    path.chmod(0o700)  # the directory under the mount: the agent's alone
    size = attempt_space.size_for(output_bytes=limit, scratch_bytes=0, log_bytes=0)
    try:
        made = attempt_space.bound(path, size=size, reuse=True, image=image(job_id))
    except attempt_space.NoRoom as exc:
        raise attempt_space.NoRoom(
            exc.needed,
            exc.free,
            disk=exc.disk,
            store="the checkpoint store",
            space="the job's checkpoint space",
            made_of="its declared checkpoint size",
        ) from exc
    if made:
        _drop_lost_and_found(path)
    path.chmod(0o700)
    sandbox.own_tree(path, uid=owner, gid=owner)
    return path


def bounded(job_id: int) -> bool:
    return os.path.ismount(directory(job_id))


def _drop_lost_and_found(path: Path) -> None:
    """A fresh filesystem's lost+found is not the job's checkpoint (and would read as one to resume from)."""
    try:
        (path / "lost+found").rmdir()
    except OSError:
        pass  # not there, or fsck put something in it: then the job gets it with the rest


def held_bytes(path: Path) -> int:
    """Bytes in regular files under ``path``, never following links. A folder that cannot be listed raises
    (OSError): os.walk would leave it out silently, and a job hid gigabytes past PATH_MAX that way."""
    total = 0
    for folder, _, names in os.walk(path, onerror=trees.raise_it):
        for name in names:
            info = (Path(folder) / name).lstat()
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return total


@dataclass(frozen=True)
class Kept:
    bytes: int  # what the next attempt is handed (0: nothing)
    note: str = ""  # why what the job saved was not kept


def settle(job_id: int, *, limit: int) -> Kept:
    """After an attempt: the directory is the agent's again and within ``limit``, or emptied with a note;
    then unmounted, its image kept for the next attempt, on whichever node it runs."""
    path = directory(job_id)
    if not path.is_dir():
        return Kept(0)
    try:
        return _measure(path, limit)
    except RecursionError:  # a tree deeper than the walk goes: not a checkpoint anyone can hand on
        empty(path)
        return Kept(
            0,
            "its checkpoint was nested too deeply to hand on and was removed: the next attempt starts from scratch",
        )
    finally:
        # Between attempts its image holds what the job wrote, not its whole declared size; mounted again,
        # it takes the rest back (or the next attempt is refused for room).
        attempt_space.give_back_unused(path)
        attempt_space.unmount(path)


def _measure(path: Path, limit: int) -> Kept:
    sandbox.reown(path)
    try:
        size = held_bytes(path)
    except OSError as exc:  # what cannot be measured cannot be held to its bound
        empty(path)
        return Kept(
            0,
            f"its checkpoint held a folder that could not be read ({exc.strerror}) and was removed: the next "
            "attempt starts from scratch",
        )
    if size <= limit:
        return Kept(size)
    empty(path)
    return Kept(
        0,
        f"its checkpoint of {format_size(size)} was over its declared checkpoint.bytes ({format_size(limit)}) "
        "and was removed: the next attempt starts from scratch",
    )


def empty(path: Path) -> None:
    """Everything under ``path`` goes (rm: no link followed, no depth limit, nothing past its filesystem)."""
    entries = list(path.iterdir())
    if entries:
        trees.remove_tree(*entries)


def remove(job_id: int) -> bool:
    """The job's checkpoint directory and image gone: False when rm left some of the directory (logged)."""
    path = directory(job_id)
    attempt_space.unmount(path)  # mounted still when its node was lost mid-attempt
    if trees.remove_tree(path):
        return False
    image(job_id).unlink(missing_ok=True)
    return True


def stored_job_ids() -> list[int]:
    """Jobs with a directory or an image here."""
    root = settings.E31_CHECKPOINT_ROOT
    names = [entry.name for entry in root.iterdir()] if root.is_dir() else []
    images = root / IMAGES
    names += [entry.name.removesuffix(".img") for entry in images.iterdir()] if images.is_dir() else []
    return sorted({int(name) for name in names if name.isdigit()})
