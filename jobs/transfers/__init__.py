"""Moving bytes onto a node and off it: what every transfer shares.

``sources`` reads (file://, http(s)://, s3://, with the address and root checks); ``destinations``
writes the local copy and hashes it as it lands. No database here: staging and delivery pass in
what they know (roots, the operator's allowances) and a ``progress`` callback, called at most every
``PROGRESS_EVERY_S``, that returns False to stop (a cancelled job, a lost claim).
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

from common import nul
from jobs.units import format_size

# What the kernel copies per call (copy_file_range), and fsspec's block size. With a sha256 the
# follower hashes each chunk once it lands: 4 MiB kept it closer behind than 16 MiB (measured faster).
CHUNK = 4 * 1024 * 1024
# What passes through Python per read (HTTP, s3) and per hash step: small enough to stay in the
# core's L2 cache between the read, the hash and the write, as curl's 100 KB reads do. Measured
# here, HTTP into a file: 0.53 CPU-s/GB at 256 KiB, 0.90 at 1 MiB, 0.78 at 4 MiB.
BUFFER = 256 * 1024
PROGRESS_EVERY_S = 0.5
MAX_REDIRECTS = 5
MAX_BACKOFF_S = 30.0
USER_AGENT = "e31-stager/1"

Progress = Callable[[int], bool]


class TransferFailed(Exception):
    """A permanent failure: retrying cannot help (refused, not found, too large, checksum). Its message often
    quotes the other end (a status line, an error body), and is stored as the job's reason: no NUL in it."""

    def __init__(self, message: str) -> None:
        super().__init__(nul.shown(message))


class TransferStopped(Exception):
    """The progress callback asked the copy to stop (the job was cancelled, or another took over)."""


class Transient(Exception):
    """A failure worth retrying: a 5xx or 429 answer, a dropped or stalled connection."""


def report(progress: Progress, done: int) -> None:
    """Tells ``progress`` how many bytes are in place; it says stop by answering False."""
    if not progress(done):
        raise TransferStopped()


@dataclass(frozen=True)
class Floor:
    """The slowest a source may send, averaged over ``window_s``: a source that sends a few bytes just
    often enough never stalls, yet would hold one of the pool's few transfer slots for days."""

    bytes_per_s: float
    window_s: float

    def check(self, sent: int, elapsed: float) -> None:
        if sent < self.bytes_per_s * elapsed:
            raise Transient(
                f"the source sent {format_size(sent)} in {elapsed:.0f} s, "
                f"under the pool's floor of {format_size(int(self.bytes_per_s))}/s"
            )


class FloorWatch:
    """A copy's bytes checked against a ``Floor`` one window at a time (no floor: never raises)."""

    def __init__(self, floor: Floor | None, done: int) -> None:
        self.floor, self.began, self.done_then = floor, time.monotonic(), done

    def passed(self, done: int) -> None:
        now = time.monotonic()
        if self.floor is not None and now - self.began >= self.floor.window_s:
            self.floor.check(done - self.done_then, now - self.began)
            self.began, self.done_then = now, done


@dataclass(frozen=True)
class SourceInfo:
    size: int | None
    validator: str  # what says the content did not change: ETag, Last-Modified, inode and mtime


@dataclass(frozen=True)
class Copied:
    bytes: int
    sha256: str
    retries: int
