"""Sources that answer in ways no honest server does, and a node whose disk fails: each ends the job's staging,
with a reason, in bounded time; none leaves the job in STAGING for the reconciler to re-drive for ever."""

import errno
import os
import socket
import threading
import time

import pytest
from django.db import connection
from django.utils import timezone

from jobs import staging
from jobs.models import DataInput, Job
from jobs.transfers import destinations
from tests.staging.conftest import file_uri, make_job, write

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER_10_BYTES = b'HTTP/1.1 200 OK\r\nContent-Length: 10\r\nETag: "v1"\r\n\r\n'


class RawServer:
    """A loopback TCP server that reads a request, then hands the connection to ``answer(n, conn)`` (n: the
    connection's number, from 1)."""

    def __init__(self, answer) -> None:
        self.answer, self.connections = answer, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._serve, daemon=True).start()

    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/data.bin"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(self.connections, conn), daemon=True).start()

    def _one(self, n: int, conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            self.answer(n, conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.sock.close()


def trickle(conn: socket.socket, first: bytes, byte: bytes, seconds: float = 30) -> None:
    """``first``, then one ``byte`` every 0.2 s: well inside the per-read timeout, for ``seconds``."""
    conn.sendall(first)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        conn.sendall(byte)
        time.sleep(0.2)


@pytest.fixture
def quick(settings, private_ok):
    settings.E31_TRANSFER_TIMEOUT_S = 0.5
    settings.E31_TRANSFER_MIN_RATE_BPS, settings.E31_TRANSFER_MIN_RATE_WINDOW_S = 64_000, 1.0
    settings.E31_TRANSFER_RETRIES, settings.E31_TRANSFER_BACKOFF_S = 1, 0.05


def stage_within(job: Job, seconds: float) -> float:
    """Stages ``job`` in a thread; how long it took, failing the test if it took longer than ``seconds``."""

    def run() -> None:
        try:
            staging.stage_job(job_id=job.id, now=timezone.now())
        finally:
            connection.close()

    began = time.monotonic()
    stager = threading.Thread(target=run, daemon=True)
    stager.start()
    stager.join(seconds)
    assert not stager.is_alive(), f"the stager was still reading after {seconds} s"
    return time.monotonic() - began


def ended_staging_failed(job: Job) -> str:
    job.refresh_from_db()
    assert (job.state, job.end_reason) == ("ended", "staging_failed")
    assert DataInput.objects.get(job=job).stage_state == "failed"
    return job.end_detail


@pytest.mark.parametrize("when", ["probe", "copy"])
def test_a_source_that_trickles_its_headers_is_given_up(roots, team, quick, when):
    """One header byte every 0.2 s under a 0.5 s read timeout: each read returned, so nothing ever ended it (a
    65,536-byte header line at the default 30 s timeout is 22 days), its stager and transfer slot held."""

    def answer(n: int, conn: socket.socket) -> None:
        if when == "copy" and n == 1:
            conn.sendall(ANSWER_10_BYTES)  # the HEAD answers at once: the GET, slot taken, trickles
            return
        trickle(conn, b"HTTP/1.1 200 OK\r\n", b"X")

    server = RawServer(answer)
    job = make_job(team, {"name": "a", "uri": server.url(), "bytes": 10})
    stage_within(job, 10)
    server.close()
    assert "timed out" in ended_staging_failed(job)


def test_a_chunk_size_line_that_trickles_is_given_up(roots, team, quick):
    def answer(n: int, conn: socket.socket) -> None:
        if n == 1:
            conn.sendall(ANSWER_10_BYTES)
            return
        trickle(conn, b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nETag: "v1"\r\n\r\n', b"0")

    server = RawServer(answer)
    job = make_job(team, {"name": "a", "uri": server.url(), "bytes": 10})
    stage_within(job, 10)
    server.close()
    ended_staging_failed(job)


def test_a_nul_in_what_the_server_says_ends_staging_with_its_reason(roots, team, quick):
    """http.client's BadStatusLine carries the line it read: stored as the input's detail, its NUL made
    PostgreSQL refuse the write, and the job stayed in STAGING with no reason, re-driven for ever."""
    server = RawServer(lambda n, conn: conn.sendall(b"XTTP\x00/1.1 200 OK\r\n\r\n"))
    job = make_job(team, {"name": "a", "uri": server.url(), "bytes": 10})
    stage_within(job, 10)
    server.close()
    detail = ended_staging_failed(job)
    assert "\x00" not in detail and "XTTP" in detail
    assert "XTTP" in DataInput.objects.get(job=job).stage_detail


def test_a_full_disk_when_the_copy_begins_ends_staging_with_its_reason(roots, team, monkeypatch):
    path, _ = write(roots.datasets / "a.bin", b"x" * 1000)
    job = make_job(team, {"name": "a", "uri": file_uri(path), "bytes": 1000})
    real_open = os.open

    def full(name, flags, *args, **kwargs):
        if str(name).endswith(".part") and flags & os.O_CREAT:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(name))
        return real_open(name, flags, *args, **kwargs)

    monkeypatch.setattr(destinations.os, "open", full)
    staging.stage_job(job_id=job.id, now=timezone.now())
    assert "No space left on device" in ended_staging_failed(job)


def test_an_unforeseen_error_ends_staging_and_says_so(roots, team, monkeypatch):
    """Whatever the stager did not foresee ends the job (its inputs cleared away) instead of leaving it in STAGING,
    where the reconciler would hand it to a stager again and again."""
    path, _ = write(roots.datasets / "a.bin", b"x" * 1000)
    job = make_job(team, {"name": "a", "uri": file_uri(path), "bytes": 1000})

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a defect in /srv/e31/stager.py")

    monkeypatch.setattr(staging, "_stage_from", broken)
    staging.stage_job(job_id=job.id, now=timezone.now())
    job.refresh_from_db()
    assert (job.state, job.end_reason) == ("ended", "staging_failed")
    assert "unexpected error" in job.end_detail and "ZeroDivisionError" in job.end_detail
    assert "/srv/e31" not in job.end_detail  # the platform's own paths are not the team's to read
    assert not staging.job_dir(job.id).exists()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.0 200 OK\r\nContent-Length: 10\r\n\r\n0123456789",  # an HTTP/1.0 server: it closes after
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\n0123456789",
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n0123456789",  # no length: read until it closes
    ],
    ids=["http-1.0", "connection-close", "until-close"],
)
def test_a_server_that_closes_after_its_answer_is_staged(roots, team, quick, answer):
    """Not hostile at all, but http.client hands the socket of such an answer to the response and forgets it:
    the copy's reader looked for it on the connection (None) and failed with an AttributeError."""
    server = RawServer(lambda n, conn: conn.sendall(answer))
    job = make_job(team, {"name": "a", "uri": server.url(), "bytes": 10})
    stage_within(job, 10)
    server.close()
    job.refresh_from_db()
    assert job.state == "queued", job.end_detail
    assert (staging.job_dir(job.id) / "a").read_bytes() == b"0123456789"


def test_a_chunked_body_is_staged_whole(roots, team, quick):
    body = (
        b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in (b"0123", b"456", b"789")) + b"0\r\n\r\n"
    )

    def answer(n: int, conn: socket.socket) -> None:
        if n == 1:
            conn.sendall(ANSWER_10_BYTES)
        else:
            conn.sendall(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nETag: "v1"\r\n\r\n' + body)

    server = RawServer(answer)
    job = make_job(team, {"name": "a", "uri": server.url(), "bytes": 10})
    stage_within(job, 10)
    server.close()
    assert (staging.job_dir(job.id) / "a").read_bytes() == b"0123456789"
