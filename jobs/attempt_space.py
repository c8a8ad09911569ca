"""An attempt's writable space, bounded: its directory is a size-limited filesystem of its own.

Each attempt's directory (work, output, its log) is an ext4 image, loop-mounted nosuid,nodev over
that directory, sized to the declared output plus the scratch allowance (``E31_SCRATCH_BYTES``)
and the log cap. A job that writes past it gets ENOSPC in its own space; the node's disk and the
other jobs keep theirs. The image's blocks are allocated on the node's disk when it is made, not
as the job writes: spaces can never promise together more than the disk holds, so a neighbour,
or the node itself, filling the disk takes nothing a running job was given, and a space the disk
cannot hold is refused (``NoRoom``) before its job starts. When the run ends, what the job left
unused goes back to the disk (``give_back_unused``). Why an image: as root it works on any local
filesystem with no quota support (project quotas need the host filesystem mounted with
prjquota), and unlike a tmpfs it is not RAM and outlives the job for sealing and delivery.
The image sits inside the directory it is mounted over, so removing the directory after
``release`` removes the image too. Where mounting is impossible (not root, no loop devices)
the attempt runs unbounded, and the node's limits say so.
"""

import contextlib
import errno
import logging
import os
import stat
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)
IMAGE = ".space.img"
MIN_BYTES = 16 * 2**20
MOUNT_OPTIONS = "loop,nosuid,nodev,noatime"
# nodiscard: on a file, mke2fs's discard punches holes through the whole image, undoing its allocation.
MKFS = ("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "nodiscard")


NODE_DISK = "the node's disk"


class NoRoom(Exception):
    """The disk (``store``) cannot hold the space: nothing is mounted, and nothing of it is left behind.

    Its message is the job's (what its space needed). ``free``: what the disk had free for the agent before the
    space was tried (for the node's log, and to tell a full disk from a large space). ``disk``: what the disk holds
    in all (None: not known), which tells a disk short of room from a space no emptying makes fit.
    """

    def __init__(
        self,
        needed: int,
        free: int,
        *,
        disk: int | None = None,
        store: str = NODE_DISK,
        space: str = "this attempt's space",
        made_of: str = "its declared output, the scratch allowance and the log cap",
    ) -> None:
        super().__init__(f"{space} needs {needed:,} bytes ({made_of}) and {store} could not hold it")
        self.needed, self.free, self.disk, self.store = needed, free, disk, store

    @property
    def larger_than_disk(self) -> bool:
        """The space would not fit the disk were nothing else on it: the job's size, not the node's shortage."""
        return self.disk is not None and self.needed > self.disk


def size_for(*, output_bytes: int, scratch_bytes: int, log_bytes: int) -> int:
    """Image size: the declared output, scratch and log, plus room for the filesystem's own metadata."""
    wanted = output_bytes + scratch_bytes + log_bytes
    return max(MIN_BYTES, wanted + wanted // 20 + 8 * 2**20)


def bound(root: Path, *, size: int, reuse: bool = False, image: Path | None = None) -> bool:
    """Mounts a fresh ``size``-byte filesystem over ``root``; False (and unbounded) where this node cannot.

    ``image``: where its file lives (default: inside ``root``, hidden by the mount). ``reuse``: an image
    already there, the agent's own regular file, is mounted again with its files instead of remade.
    """
    root.mkdir(parents=True, exist_ok=True)
    if os.path.ismount(root):
        return True  # already bounded: a re-run of the same attempt's start
    image = image or root / IMAGE
    fresh = not (reuse and _own_regular_file(image))
    try:
        if fresh:
            image.unlink(missing_ok=True)
            _allocate(os.open(image, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), size)
            _run(*MKFS, str(image))
        else:  # blocks an earlier run gave back are taken again: the space is whole before its job writes
            _allocate(os.open(image, os.O_RDWR | os.O_NOFOLLOW), image.stat().st_size)
        _run("mount", "-o", MOUNT_OPTIONS, str(image), str(root))
    except NoRoom:
        if fresh:
            image.unlink(missing_ok=True)
        raise
    except (OSError, subprocess.SubprocessError) as exc:  # a hung mkfs/mount (TimeoutExpired) too
        if fresh:
            image.unlink(missing_ok=True)
        log.warning("space %s is not bounded: %s", root, _why(exc))
        return False
    return True


def _allocate(fd: int, size: int) -> None:
    """The image's ``size`` bytes, allocated on the node's disk now (and the descriptor closed). Read and
    write: where the filesystem has no fallocate, glibc emulates it, reading each block before writing it."""
    try:
        # Measured first: a failed fallocate keeps what it took (ext4), and the disk would then read as full.
        # Blocks kept for root count: the agent, as root, takes them too.
        disk = os.fstatvfs(fd)
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        free, total = disk.f_bfree * disk.f_frsize, disk.f_blocks * disk.f_frsize
        raise NoRoom(needed=size, free=free, disk=total) from exc
    finally:
        os.close(fd)


def give_back_unused(root: Path) -> None:
    """Once the run has ended: the blocks its job never wrote, or freed, go back to the node's disk.
    Sealing and delivery only read what is left; the space stays mounted and bounded for them."""
    if not os.path.ismount(root):
        return
    try:
        # Written first: data still in the page cache has no blocks yet, and fstrim would count them as
        # free; flushed after the trim, it would need blocks from a disk that may be full by then.
        _run("sync", "--file-system", str(root))
        # ext4 discards its free blocks; the loop device punches them out of the image.
        _run("fstrim", str(root))
    except (OSError, subprocess.SubprocessError) as exc:  # the space keeps its allocation until removed
        log.warning("space %s kept its unused blocks: %s", root, _why(exc))


def _own_regular_file(path: Path) -> bool:
    """The agent's own image, never a link or a file a job could have made (root mounts what it finds)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_nlink == 1


def unmount(root: Path) -> None:
    """Unmounts the filesystem over ``root`` (its loop device detaches with it); its image stays for ``reuse``."""
    if os.path.ismount(root):
        _run("umount", "--lazy", str(root))


def release(root: Path) -> None:
    """Unmounts the attempt's filesystem; the files go with the image."""
    unmount(root)
    (root / IMAGE).unlink(missing_ok=True)


def release_all(under: Path) -> list[str]:
    """Releases every attempt space mounted below ``under`` (a whole state directory being removed)."""
    released = []
    prefix = str(under.resolve()) + "/"
    for mountpoint in _mountpoints():
        if mountpoint.startswith(prefix):
            release(Path(mountpoint))
            released.append(mountpoint)
    return released


def probe(under: Path) -> str:
    """'' when this node can bound attempt space, else why not (for the pool page)."""
    target = under / ".space-probe"
    try:
        if not bound(target, size=MIN_BYTES):
            return "attempt disk unbounded (cannot mount a loop filesystem here)"
        release(target)
    except NoRoom:
        return f"attempt disk unbounded (its disk cannot hold even a {MIN_BYTES // 2**20} MiB space)"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"attempt disk unbounded ({_why(exc)})"
    finally:
        with contextlib.suppress(OSError):  # still a mount point only if its release failed: then it stays
            target.rmdir()
    return ""


def _mountpoints() -> list[str]:
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    # Deepest first, so nested mounts come off before their parents; octal escapes as the kernel writes them.
    points = [line.split()[1].encode().decode("unicode_escape") for line in lines if len(line.split()) > 1]
    return sorted(points, key=len, reverse=True)


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)


def _why(exc: Exception) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        return (exc.stderr or b"").decode(errors="replace").strip()[:200] or str(exc)
    return str(exc)
