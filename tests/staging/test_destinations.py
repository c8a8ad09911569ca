"""The copy loop's sha256 covers exactly the bytes in place, through resumes and restarts (no database)."""

import hashlib
import io
import os
import time

import pytest

from jobs import transfers
from jobs.transfers import destinations, sources

CONTENT = os.urandom(9 * 1024 * 1024 + 123)  # more than two of the hasher's buffers, not a whole number


class Flaky:
    """A stream source that fails once after ``cut`` bytes, then resumes from ``resume_at`` (0: restarts)."""

    def __init__(self, cut: int, *, resumes: bool) -> None:
        self.cut, self.resumes, self.opens = cut, resumes, 0

    def open(self, offset: int) -> sources._StreamReader:
        self.opens += 1
        start = offset if self.resumes else 0
        end = self.cut if self.opens == 1 else len(CONTENT)
        return Cut(io.BytesIO(CONTENT[start:end]), start, failing=self.opens == 1)


class Cut(sources._StreamReader):
    def __init__(self, stream, offset: int, *, failing: bool) -> None:
        super().__init__(stream, offset)
        self.failing = failing

    def readinto(self, buf: memoryview) -> int:
        n = self.stream.readinto(buf)
        if not n and self.failing:
            raise transfers.Transient("the connection dropped")
        return n


def copy(source, tmp_path) -> transfers.Copied:
    return destinations.copy(source, tmp_path / "out", limit=len(CONTENT), want_sha256=True,
                             progress=lambda done: True, retries=2, backoff_s=0)  # fmt: skip


def test_a_resumed_copy_hashes_each_byte_once(tmp_path):
    copied = copy(Flaky(5 * 1024 * 1024 + 7, resumes=True), tmp_path)
    assert copied.sha256 == hashlib.sha256(CONTENT).hexdigest() and copied.retries == 1
    assert (tmp_path / "out").read_bytes() == CONTENT


def test_a_source_that_sends_everything_again_is_hashed_afresh(tmp_path):
    copied = copy(Flaky(3 * 1024 * 1024, resumes=False), tmp_path)
    assert copied.sha256 == hashlib.sha256(CONTENT).hexdigest()
    assert (tmp_path / "out").read_bytes() == CONTENT


def test_a_local_file_is_hashed_as_it_is_copied(tmp_path):
    (tmp_path / "in").write_bytes(CONTENT)
    source = sources.LocalSource(tmp_path / "in")
    assert copy(source, tmp_path).sha256 == hashlib.sha256(CONTENT).hexdigest()
    source.close()


def test_a_local_copy_is_hashed_through_mappings_that_start_mid_page(tmp_path, monkeypatch):
    monkeypatch.setattr(destinations, "MAP_WINDOW", 1024 * 1024 + 4097)  # every window after the first
    (tmp_path / "in").write_bytes(CONTENT)
    source = sources.LocalSource(tmp_path / "in")
    assert copy(source, tmp_path).sha256 == hashlib.sha256(CONTENT).hexdigest()
    source.close()


def test_a_copy_shrinking_under_the_follower_is_an_error_not_a_crash(tmp_path):
    """A mapped page past the end of the file would be SIGBUS, which no handler catches."""
    path = tmp_path / "out"
    path.write_bytes(CONTENT[:10_000])
    follower = destinations._Follower(path)
    os.truncate(path, 100)
    follower.advance(10_000)
    with pytest.raises(OSError, match="shrank while being hashed"):
        follower.finish()


@pytest.fixture
def slow_follower(monkeypatch):
    """A follower that hashes 1 MiB windows at 0.2 s each: far behind the kernel's copy of ``CONTENT``,
    as hashing trails a fast disk's copy of a large dataset (sha256 at ~1 GB/s behind a 2+ GB/s copy)."""
    monkeypatch.setattr(destinations, "MAP_WINDOW", 1024 * 1024)
    hash_range = destinations._Follower._hash_range

    def slowly(self, fd, pos, end):
        time.sleep(0.2)
        return hash_range(self, fd, pos, end)

    monkeypatch.setattr(destinations._Follower, "_hash_range", slowly)


def test_a_copy_waiting_for_its_hash_to_catch_up_still_reports_progress(tmp_path, slow_follower):
    (tmp_path / "in").write_bytes(CONTENT)
    source = sources.LocalSource(tmp_path / "in")
    reports = []
    copied = destinations.copy(source, tmp_path / "out", limit=len(CONTENT), want_sha256=True,
                               progress=lambda done: reports.append(done) or True, retries=0, backoff_s=0)  # fmt: skip
    source.close()
    assert copied.sha256 == hashlib.sha256(CONTENT).hexdigest()
    # ~2 s of hashing after a copy the kernel made at once: the stager's heartbeat goes on meanwhile
    assert reports.count(len(CONTENT)) >= 2


def test_a_cancel_while_the_hash_catches_up_stops_the_copy_at_once(tmp_path, slow_follower):
    (tmp_path / "in").write_bytes(CONTENT)
    source = sources.LocalSource(tmp_path / "in")
    began = time.monotonic()
    with pytest.raises(transfers.TransferStopped):
        destinations.copy(source, tmp_path / "out", limit=len(CONTENT), want_sha256=True,
                          progress=lambda done: done < len(CONTENT), retries=0, backoff_s=0)  # fmt: skip
    source.close()
    assert time.monotonic() - began < 1.2  # not the ~2 s the whole hash would take
