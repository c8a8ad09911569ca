"""A client that stops reading holds its web thread, and the sending place its download took, only so long.

Found by review: a download whose client never read (a receive buffer of 4 KB, nothing taken from it) blocked
gunicorn's write for as long as the socket stayed open, holding a thread and one of the process's sending places
(E31_EXPORTS_PER_PROCESS); every other download of its team was answered 429 until the client let go. Every
request's socket now has a deadline of E31_CLIENT_STALL_S for each read and write: past it the connection is
dropped and the place given back.
"""

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client

from jobs.models import LogChunk
from tests.e2e.conftest import wait_for
from tests.e2e.embedded import free_port
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
STALL_S = 3


@pytest.fixture
def web(transactional_db, tmp_path):
    """gunicorn as deployed (threads), one sending place, stalls cut after STALL_S."""
    db = connection.settings_dict
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "E31_STATE_DIR": str(tmp_path),
        "E31_EXPORTS_PER_PROCESS": "1",
        "E31_CLIENT_STALL_S": str(STALL_S),
    }
    env.pop("E31_TEST_DB_NAME", None)
    env.pop("E31_CACHE_URL", None)
    cmd = [sys.executable, "-m", "gunicorn", "e31web.wsgi", "--workers", "1", "--threads", "3",
           "--timeout", "120", "--bind", f"127.0.0.1:{port}"]  # fmt: skip
    server = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(
            lambda: _status(port, "/healthz") == 200,
            timeout=60,
            every=0.3,
            what="gunicorn to answer /healthz",
        )
        yield port
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def _status(port: int, path: str, cookie: str = "") -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", headers={"Cookie": f"sessionid={cookie}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def _never_read(port: int, path: str, cookie: str) -> socket.socket:
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    held.connect(("127.0.0.1", port))
    held.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: sessionid={cookie}\r\n\r\n".encode())
    return held


def test_a_download_never_read_gives_its_place_back_after_the_stall_deadline(web, team, member):
    job = JobFactory(team=team, state="released", end_reason="succeeded", attempt=1)
    piece = b"x" * (256 * 1024)
    LogChunk.objects.bulk_create(
        LogChunk(job=job, attempt=1, rank=0, offset=i * len(piece), data=piece) for i in range(32)
    )  # an 8 MB log: far more than the sockets' buffers hold
    client = Client()
    client.force_login(member)
    cookie = client.cookies["sessionid"].value
    path = f"/jobs/{job.id}/log/?attempt=1"

    # Read whole once first: the worker's first request (imports, connections) could take most of the window in
    # which the stalled download holds its place, on a busy machine.
    assert _status(web, path, cookie) == 200
    held = _never_read(web, path, cookie)
    try:
        # The one place is the stalled download's, from the moment the server takes its request until STALL_S
        # after its buffers filled: that window starts when the server gets to it, so the wait is longer.
        wait_for(lambda: _status(web, path, cookie) == 429, timeout=2 * STALL_S, every=0.1, what="the 429")
        wait_for(
            lambda: _status(web, path, cookie) == 200, timeout=5 * STALL_S, every=0.5,
            what=f"the stalled download to give its place back within {5 * STALL_S} s",
        )  # fmt: skip
    finally:
        held.close()
