"""Folders and files opened beneath a folder held open, one name at a time, never through a link.

Why: a path checked by its name (``os.path.realpath``, ``is_file``) and then used by its name is walked twice,
and a member who can write in the team's output folder (a shared mount) can rename a folder away and put a link
in its place in between: the check sees the team's folder, the write or read lands in another team's. Linux's
openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) closes that in one call, but Python has no binding to it. Opening
each name with O_NOFOLLOW relative to the descriptor of the folder before it does the same: a link anywhere on
the way fails the open, never leads elsewhere, and a folder renamed once it is open is still the one used.
"""

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class NotBeneath(OSError):
    """A name on the way is a link or no folder (followed, it could lead anywhere), or could climb out (``..``)."""


def names(rel: str) -> list[str]:
    """The names of a relative path; an empty, ``.`` or ``..`` name is refused, not resolved."""
    parts = rel.split("/")
    if any(name in ("", ".", "..") or "\x00" in name for name in parts):
        raise NotBeneath(errno.EINVAL, "not a plain relative path", rel[:200])
    return parts


def open_dir(root: int | str | Path, parts: Sequence[str], *, create: bool = False) -> int:
    """The folder ``parts`` beneath ``root`` (a descriptor, or a path the caller trusts, opened as it is), made on
    the way with ``create``. The caller closes the descriptor returned."""
    if isinstance(root, int):
        fd = os.dup(root)
    else:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts:
            child = _child(fd, name, create)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _child(fd: int, name: str, create: bool) -> int:
    try:
        return _open_folder(fd, name)
    except FileNotFoundError:
        if not create:
            raise
    # Made meanwhile (by another part's task): opened, and checked, alike.
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, dir_fd=fd)
    return _open_folder(fd, name)


def _open_folder(fd: int, name: str) -> int:
    try:
        return os.open(name, DIRECTORY, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):  # Linux answers ENOTDIR for a link with O_DIRECTORY
            raise NotBeneath(exc.errno, "a link or no folder", name) from exc
        raise


def open_under(real: Path, prefixes: Sequence[Path], *, create: bool = False) -> int:
    """``real``, a path checked to lie under one of ``prefixes`` (folders no team can replace: its own folder of an
    output root), opened from that prefix down; a link put on the way since the check fails the open."""
    prefix = next((p for p in prefixes if real == p or real.is_relative_to(p)), None)
    if prefix is None:
        raise NotBeneath(errno.EXDEV, "not under the team's folder", str(real))
    if create:
        os.makedirs(prefix, exist_ok=True)
    return open_dir(prefix, real.relative_to(prefix).parts, create=create)


def open_regular(root: int, rel: str) -> int:
    """The regular file ``rel`` beneath ``root``, for reading. O_NONBLOCK: a FIFO swapped in is opened at once
    (and refused), where a plain open would wait for a writer and hold the process that asked."""
    *folders, name = names(rel)
    folder = open_dir(root, folders)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    finally:
        os.close(folder)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotBeneath(errno.EINVAL, "not a regular file", rel[:200])
    os.set_blocking(fd, True)
    return fd


def path_in(fd: int, name: str) -> Path:
    """A path to ``name`` in the folder held by ``fd`` whatever that folder is called by now, for code that only
    takes paths: Linux's /proc/self/fd/<fd> leads to the open folder itself, not to its name."""
    return Path(f"/proc/self/fd/{fd}/{name}")


@contextlib.contextmanager
def closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)
