"""Where bytes land: the local file being written, its sha256, and the copy loop with its retries.

Local files are copied by the kernel (``copy_file_range``, as ``cp`` does); with a sha256 a
follower thread hashes the copy as it lands. Streams go through one cache-sized buffer without a
sha256; with one, the copy reads into large buffers and a second thread hashes each buffer once
it is written, while the copy reads the next. Either way checking costs no second pass after the
copy and overlaps it on two cores. The copy loop writes progress rarely.
"""

import hashlib
import http.client
import mmap
import os
import queue
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

from jobs import transfers
from jobs.transfers import sources

# With a sha256: buffers in flight between the copy and the hashing thread, and their size. Large
# enough that a hand-over per buffer costs little beside hashing it, small enough that a buffer is
# still in the cache when it is written and hashed. Measured here, 1 GB over HTTP from 127.0.0.1,
# medians of seven interleaved runs: 4 MiB x 4 468 MB/s, 256 KiB x 32 791, 512 KiB x 16 871,
# the same copy without a sha256 870.
HASH_BUFFER = 512 * 1024
HASH_BUFFERS = 16
# The most of a local copy the follower maps at once: mappings stay small however far it lags.
MAP_WINDOW = 64 * 1024 * 1024


class _Follower(threading.Thread):
    """sha256 of a local copy as the kernel writes it, on another thread (hashlib releases the GIL),
    so the copy itself never passes through Python. The follower hashes the written range straight
    from the page cache through a read-only mapping: reading it back into a buffer first cost a
    copy per byte (measured here, 1 GB: a pread follower 1,075 MB/s, a mapping 1,228 MB/s, hashlib
    over the file alone 1,155 MB/s, medians of five)."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True, name="e31-sha256")
        self.path, self.sha256 = path, hashlib.sha256()
        self._cond = threading.Condition()
        self._written, self._closed, self._abandoned = 0, False, False
        self.error: BaseException | None = None
        self.start()

    def advance(self, written: int) -> None:
        with self._cond:
            self._written = written
            self._cond.notify()

    def finish(self, *, abandon: bool = False, beat: Callable[[], None] | None = None) -> str:
        """The sha256 once the follower has caught up with the copy, which the kernel may have made
        far faster than it hashes (a large dataset: minutes behind). ``beat`` is called every
        PROGRESS_EVERY_S of that wait; whatever it raises (a cancel) abandons the hash at once."""
        with self._cond:
            self._closed, self._abandoned = True, abandon
            self._cond.notify()
        try:
            while self.is_alive():
                self.join(timeout=transfers.PROGRESS_EVERY_S)
                if self.is_alive() and beat is not None:
                    beat()
        except BaseException:
            self._abandoned = True
            self.join()
            raise
        if self.error is not None and not abandon:
            raise self.error
        return self.sha256.hexdigest()

    def run(self) -> None:
        try:
            self._follow()
        except BaseException as exc:  # handed to finish()
            self.error = exc

    def _follow(self) -> None:
        pos = 0
        fd = os.open(self.path, os.O_RDONLY)
        try:
            while True:
                with self._cond:
                    while not (self._written > pos or self._closed):
                        self._cond.wait()
                    if self._abandoned or pos >= self._written:
                        return
                    target = self._written
                while pos < target and not self._abandoned:
                    pos = self._hash_range(fd, pos, min(target, pos + MAP_WINDOW))
        finally:
            os.close(fd)

    def _hash_range(self, fd: int, pos: int, end: int) -> int:
        # Only this stager writes the file and it never shrinks below what was announced (a
        # restart stops the follower before truncating), so the mapping never reaches past its end:
        # checked all the same, as a page past the end would be SIGBUS, not an error.
        if os.fstat(fd).st_size < end:
            raise OSError(f"{self.path} shrank while being hashed")
        start = pos - pos % mmap.ALLOCATIONGRANULARITY
        with mmap.mmap(fd, end - start, prot=mmap.PROT_READ, offset=start) as mapped:
            with memoryview(mapped) as view:
                self.sha256.update(view[pos - start :])
        return end


class _Hasher(threading.Thread):
    """sha256 of the bytes written, on a thread of its own, from the very buffers they were written
    from. hashlib releases the GIL on large buffers, so the copy reads the next buffer meanwhile."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="e31-sha256")
        self.sha256 = hashlib.sha256()
        self._full: queue.SimpleQueue[tuple[memoryview, int] | None] = queue.SimpleQueue()
        self._free: queue.SimpleQueue[memoryview] = queue.SimpleQueue()
        for _ in range(HASH_BUFFERS):
            self._free.put(memoryview(bytearray(HASH_BUFFER)))
        self.start()

    def empty_buffer(self) -> memoryview:
        """A buffer the hasher is done with (waits while all of them are still being hashed)."""
        return self._free.get()

    def hash(self, buf: memoryview, n: int) -> None:
        self._full.put((buf, n))

    def finish(self) -> str:
        self._full.put(None)
        self.join()
        return self.sha256.hexdigest()

    def run(self) -> None:
        while (item := self._full.get()) is not None:
            buf, n = item
            self.sha256.update(buf[:n])
            self._free.put(buf)


class _Destination:
    """The file being written: how much of it is in place, and the sha256 of exactly those bytes.

    A local source is copied by the kernel, and with a sha256 a follower thread hashes the copy as
    it lands. A stream goes through one cache-sized buffer without a sha256; with one, into large
    buffers, each written and then handed to the hashing thread, so reading and writing the next
    buffer overlaps hashing the last. (Measured here under load, the kernel copy with its follower
    beat reading a local file through the hashing thread's buffers: 201 against 83 MB/s, medians.)
    """

    def __init__(self, path: Path, *, want_sha256: bool, kernel_copy: bool) -> None:
        self.path, self.want_sha256, self.kernel_copy = path, want_sha256, kernel_copy
        # Always a new file: a link planted under this name (in a folder others can write) is removed, never
        # followed, and one planted again meanwhile fails the open (O_EXCL) rather than be written through.
        path.unlink(missing_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.done = 0
        self._start_hashing()

    def _start_hashing(self) -> None:
        follow = self.want_sha256 and self.kernel_copy
        self.follower = _Follower(self.path) if follow else None
        self.hasher = _Hasher() if self.want_sha256 and not follow else None
        self._buf: memoryview | None = None
        self._filled = 0

    def restart(self) -> None:
        """The source sent the whole body again: drop what was written and hash afresh."""
        self._stop_hashing()
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        self.done = 0
        self._start_hashing()

    def take(self, reader, want: int) -> int:
        """One step of at most ``want`` bytes from ``reader``; 0 at the end of the source."""
        if self.hasher is None:
            n = reader.pump(self.fd, min(transfers.CHUNK, want))
        else:
            n = self._take_hashed(reader, want)
        self.done += n
        if self.follower is not None:
            self.follower.advance(self.done)
        return n

    def _take_hashed(self, reader, want: int) -> int:
        if self._buf is None:
            self._buf, self._filled = self.hasher.empty_buffer(), 0
        view = self._buf[self._filled : self._filled + min(want, len(self._buf) - self._filled)]
        n = reader.readinto(view)
        sources.write_all(self.fd, view[:n])
        # Counted once written: a failed write leaves the buffer covering exactly ``done``, and
        # the next try goes on filling it from there.
        self._filled += n
        if self._filled == len(self._buf):
            self._hand_over()
        return n

    def _hand_over(self) -> None:
        if self._buf is not None and self._filled:
            self.hasher.hash(self._buf, self._filled)
            self._buf = None

    def digest(self, progress: transfers.Progress) -> str:
        """The sha256 of the bytes in place; while a follower catches up, ``progress`` goes on being told."""
        if self.follower is not None:
            follower, self.follower = self.follower, None
            return follower.finish(beat=lambda: transfers.report(progress, self.done))
        if self.hasher is None:
            return ""
        self._hand_over()
        hasher, self.hasher = self.hasher, None
        return hasher.finish()

    def _stop_hashing(self) -> None:
        if self.follower is not None:
            self.follower.finish(abandon=True)
            self.follower = None
        if self.hasher is not None:
            self.hasher.finish()
            self.hasher = None

    def close(self) -> None:
        self._stop_hashing()
        os.close(self.fd)


def copy(source, dst: Path, *, limit: int, want_sha256: bool, progress: transfers.Progress, retries: int,
         backoff_s: float, floor: transfers.Floor | None = None) -> transfers.Copied:  # fmt: skip
    """Copies the source to ``dst`` (at most ``limit`` bytes, else refused), resuming after transient errors;
    a source slower than ``floor`` is one."""
    try:
        out = _Destination(dst, want_sha256=want_sha256, kernel_copy=isinstance(source, sources.LocalSource))
    except OSError as exc:  # a full or read-only disk, on this node: the job cannot stage here
        raise transfers.TransferFailed(f"the copy could not begin on this node: {_describe(exc)}") from exc
    tries = 0
    try:
        while True:
            try:
                _one_try(source, out, limit=limit, progress=progress, floor=floor)
                break
            except (transfers.Transient, http.client.HTTPException, OSError) as exc:
                if isinstance(
                    exc,
                    FileNotFoundError | PermissionError | IsADirectoryError | ssl.SSLCertVerificationError,
                ):
                    raise transfers.TransferFailed(_describe(exc)) from exc
                tries += 1
                if tries > retries:
                    raise transfers.TransferFailed(
                        f"gave up after {retries} retries: {_describe(exc)}"
                    ) from exc
                _back_off(min(transfers.MAX_BACKOFF_S, backoff_s * 2 ** (tries - 1)), out.done, progress)
        return transfers.Copied(out.done, out.digest(progress), tries)
    finally:
        out.close()


def _one_try(
    source, out: _Destination, *, limit: int, progress: transfers.Progress, floor: transfers.Floor | None
) -> None:
    """Reads from where the destination ends; a source that cannot resume starts it over."""
    reader = source.open(out.done)
    try:
        if reader.offset != out.done:
            out.restart()
        if os.fstat(out.fd).st_size != out.done:
            # A write cut short by the error leaves nothing past ``done``. Only then: on ext4 a
            # truncate to 0 makes close() flush the whole file to disk (auto_da_alloc).
            os.ftruncate(out.fd, out.done)
        os.lseek(out.fd, out.done, os.SEEK_SET)
        _pump(reader, out, limit=limit, progress=progress, floor=floor)
    finally:
        reader.close()


def _pump(
    reader, out: _Destination, *, limit: int, progress: transfers.Progress, floor: transfers.Floor | None
) -> None:
    last = time.monotonic()
    pace = transfers.FloorWatch(floor, out.done)
    # One byte more than the limit shows a larger source.
    while out.take(reader, limit + 1 - out.done):
        if out.done > limit:
            raise transfers.TransferFailed(f"the source is larger than the {limit} bytes declared: cut off")
        if time.monotonic() - last >= transfers.PROGRESS_EVERY_S:
            last = time.monotonic()
            transfers.report(progress, out.done)
        pace.passed(out.done)


def _back_off(delay: float, done: int, progress: transfers.Progress) -> None:
    """Sleeps before a retry, still answering to a cancel."""
    deadline = time.monotonic() + delay
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, transfers.PROGRESS_EVERY_S))
        transfers.report(progress, done)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) < 200 else text[:200] + "…"
