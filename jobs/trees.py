"""Walking and removing a tree that a job or an image made, however deep it nests."""

import logging
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


def remove_tree(*paths: Path) -> list[Path]:
    """``rm -rf --one-file-system``: it walks without recursing, so no depth a job or an image made stops it
    (``shutil.rmtree`` raises RecursionError past about a thousand levels on Python 3.11, whatever
    ``ignore_errors`` says), and it never crosses into a mount; a missing path is no error.

    Returns those of ``paths`` still there (a mount rm would not cross, a busy file system), logged with rm's
    reason: the attempt and checkpoint sweeps count only the rest and try these again on their next pass.
    """
    done = subprocess.run(
        ["rm", "-rf", "--one-file-system", "--", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    left = [Path(path) for path in paths if os.path.lexists(path)]
    if left:
        log.warning("could not remove %s: %s", ", ".join(map(str, left)), done.stderr.strip()[:500])
    return left


def entries(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every path below ``root`` with its own status (links are not followed), walked from a list rather than by
    recursion: ``os.walk`` recurses once per level on Python 3.11, and an image 1,200 folders deep raised
    RecursionError. A path gone meanwhile (a writer's temporary one) is left out."""
    folders = [os.fspath(root)]
    while folders:
        try:
            listing = os.scandir(folders.pop())
        except FileNotFoundError:
            continue
        with listing:
            for entry in listing:
                try:
                    status = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(status.st_mode):
                    folders.append(entry.path)
                yield entry.path, status


def raise_it(error: OSError) -> None:
    """``os.walk``'s ``onerror`` for a tree a job made: a folder it cannot list (past PATH_MAX, say, which a job
    reaches by descriptors) is an error, never silently left out of what is measured or sealed."""
    raise error
