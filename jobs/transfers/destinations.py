"""Where bytes land: the local file being written, its sha256, and the copy loop with its retries.

Local files are copied by the kernel (``copy_file_range``, as ``cp`` does); when a sha256 is
wanted a second thread hashes the copy as it lands, beside the copy. Streams go through one
cache-sized buffer, hashed in the same pass as they are written. Either way checking costs no
second pass after the copy, and the copy loop writes progress rarely.
"""

import hashlib
import http.client
import os
import ssl
import threading
import time
from pathlib import Path

from jobs import transfers
from jobs.transfers import sources


class _Follower(threading.Thread):
    """sha256 of a local copy as the kernel writes it, read back on another thread (pread and
    hashlib release the GIL), so the copy itself never passes through Python."""

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

    def finish(self, *, abandon: bool = False) -> str:
        with self._cond:
            self._closed, self._abandoned = True, abandon
            self._cond.notify()
        self.join()
        if self.error is not None and not abandon:
            raise self.error
        return self.sha256.hexdigest()

    def run(self) -> None:
        try:
            self._follow()
        except BaseException as exc:  # handed to finish()
            self.error = exc

    def _follow(self) -> None:
        buf, pos = memoryview(bytearray(transfers.BUFFER)), 0
        fd = os.open(self.path, os.O_RDONLY)
        try:
            while True:
                with self._cond:
                    while not (self._written > pos or self._closed):
                        self._cond.wait()
                    if self._abandoned or pos >= self._written:
                        return
                    target = self._written
                while pos < target:
                    n = os.preadv(fd, [buf[: min(transfers.BUFFER, target - pos)]], pos)
                    if n == 0:
                        raise OSError(f"{self.path} shrank while being hashed")
                    self.sha256.update(buf[:n])
                    pos += n
        finally:
            os.close(fd)


class _Destination:
    """The file being written: how much of it is in place, and the sha256 of exactly those bytes.

    A local source is copied by the kernel and hashed by a follower thread reading the copy back;
    a stream is hashed in the same pass as it is written, from the buffer it arrived in.
    """

    def __init__(self, path: Path, *, want_sha256: bool, kernel_copy: bool) -> None:
        self.path, self.want_sha256, self.kernel_copy = path, want_sha256, kernel_copy
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self.done = 0
        self._hashers()
        self.buf = memoryview(bytearray(transfers.BUFFER)) if self.sha256 is not None else None

    def _hashers(self) -> None:
        follow = self.want_sha256 and self.kernel_copy
        self.follower = _Follower(self.path) if follow else None
        self.sha256 = hashlib.sha256() if self.want_sha256 and not follow else None

    def restart(self) -> None:
        """The source sent the whole body again: drop what was written and hash afresh."""
        if self.follower is not None:
            self.follower.finish(abandon=True)
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        self.done = 0
        self._hashers()

    def wrote(self, n: int) -> None:
        self.done += n
        if self.follower is not None:
            self.follower.advance(self.done)

    def digest(self) -> str:
        if self.follower is not None:
            follower, self.follower = self.follower, None
            return follower.finish()
        return self.sha256.hexdigest() if self.sha256 is not None else ""

    def close(self) -> None:
        if self.follower is not None:
            self.follower.finish(abandon=True)
        os.close(self.fd)


def copy(source, dst: Path, *, limit: int, want_sha256: bool, progress: transfers.Progress, retries: int,
         backoff_s: float) -> transfers.Copied:  # fmt: skip
    """Copies the source to ``dst`` (at most ``limit`` bytes, else refused), resuming after transient errors."""
    out = _Destination(dst, want_sha256=want_sha256, kernel_copy=isinstance(source, sources.LocalSource))
    tries = 0
    try:
        while True:
            try:
                _one_try(source, out, limit=limit, progress=progress)
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
        return transfers.Copied(out.done, out.digest(), tries)
    finally:
        out.close()


def _one_try(source, out: _Destination, *, limit: int, progress: transfers.Progress) -> None:
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
        _pump(reader, out, limit=limit, progress=progress)
    finally:
        reader.close()


def _pump(reader, out: _Destination, *, limit: int, progress: transfers.Progress) -> None:
    last = time.monotonic()
    # One byte more than the limit shows a larger source.
    while n := _move(reader, out, limit + 1 - out.done):
        out.wrote(n)
        if out.done > limit:
            raise transfers.TransferFailed(f"the source is larger than the {limit} bytes declared: cut off")
        if time.monotonic() - last >= transfers.PROGRESS_EVERY_S:
            last = time.monotonic()
            if not progress(out.done):
                raise transfers.TransferStopped()


def _move(reader, out: _Destination, want: int) -> int:
    """One step: straight into the file when no stream hash is wanted (in the kernel for local
    files), else read, hashed and written in one pass over a cache-sized buffer."""
    if out.sha256 is None:
        return reader.pump(out.fd, min(transfers.CHUNK, want))
    view = out.buf[: min(transfers.BUFFER, want)]
    n = reader.readinto(view)
    sources.write_all(out.fd, view[:n])
    out.sha256.update(view[:n])  # once written: after a failed write it still covers exactly ``done``
    return n


def _back_off(delay: float, done: int, progress: transfers.Progress) -> None:
    """Sleeps before a retry, still answering to a cancel."""
    deadline = time.monotonic() + delay
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, transfers.PROGRESS_EVERY_S))
        if not progress(done):
            raise transfers.TransferStopped()


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) < 200 else text[:200] + "…"


def sha256_of(path: Path) -> str:
    """One pass over a local file, in large blocks."""
    digest = hashlib.sha256()
    buf = memoryview(bytearray(transfers.BUFFER))
    with open(path, "rb", buffering=0) as handle:
        while n := handle.readinto(buf):
            digest.update(buf[:n])
    return digest.hexdigest()
