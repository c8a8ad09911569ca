"""The limits hold across web processes: two gunicorn workers on loopback share every count.

The reproduction: with the cache in each process's memory, `make run`'s two gunicorn workers each
counted on their own, and 19 failed sign-ins for one user were answered before a 429 (limit 10),
10 intake posts before a 429 (limit 5). Here the same two workers serve the requests (the access log
names the worker of each), behind a trusted proxy (loopback) so the test can speak for several clients.
"""

import http.cookiejar
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection

from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
ATTACKER, OPERATOR_ELSEWHERE, FORM_SENDER = "203.0.113.7", "198.51.100.9", "203.0.113.8"


class Site:
    """A browser of sorts: cookies, the CSRF token, a client address set by our proxy, no redirects."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        no_redirects = type(
            "NoRedirects", (urllib.request.HTTPRedirectHandler,), {"redirect_request": lambda *a: None}
        )
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), no_redirects)

    def get(self, path: str) -> int:
        return self._send(urllib.request.Request(self.base + path))

    def post(self, path: str, data: dict, *, client: str) -> int:
        if not any(c.name == "csrftoken" for c in self.jar):
            self.get(path)
        token = next(c.value for c in self.jar if c.name == "csrftoken")
        body = urllib.parse.urlencode({**data, "csrfmiddlewaretoken": token}).encode()
        request = urllib.request.Request(self.base + path, data=body, headers={"X-Forwarded-For": client})
        return self._send(request)

    def _send(self, request: urllib.request.Request) -> int:
        try:
            with self.opener.open(request, timeout=60) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def two_workers(transactional_db, tmp_path):
    db = connection.settings_dict
    port, access_log = _free_port(), tmp_path / "access.log"
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "E31_STATE_DIR": str(tmp_path),
        "E31_TRUSTED_PROXIES": "127.0.0.1",  # the test speaks through loopback as the clients' proxy
        "E31_LOGIN_FAILURE_LIMIT": "10",
        "E31_PUBLIC_FORM_LIMIT": "5",
    }
    env.pop("E31_TEST_DB_NAME", None)
    env.pop("E31_CACHE_URL", None)  # the embedded default: the database's cache table
    cmd = [
        sys.executable, "-m", "gunicorn", "e31web.wsgi", "--workers", "2", "--timeout", "120", "--bind", f"127.0.0.1:{port}",
        "--access-logfile", str(access_log), "--access-logformat", "%(p)s %(m)s %(U)s %(s)s",
    ]  # fmt: skip
    server = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    site = Site(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if site.get("/healthz") == 200:
                    break
            except OSError:
                time.sleep(0.2)
        else:
            raise AssertionError("gunicorn did not answer /healthz within 60 s")
        yield site, access_log
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def _served_by(access_log: Path, path: str) -> list[tuple[str, str]]:
    """(worker pid, status) of each POST to path, in order."""
    lines = access_log.read_text().splitlines()
    return [
        (m[1], m[2]) for line in lines if (m := re.match(rf"^<(\d+)> POST {re.escape(path)} (\d+)$", line))
    ]


def _accept_queue(port: int) -> int:
    """Connections waiting in the listening socket's backlog (rx_queue of a LISTEN row in /proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == f"0100007F:{port:04X}" and fields[3] == "0A":  # 127.0.0.1:port, state LISTEN
            return int(fields[4].split(":")[1], 16)
    raise AssertionError(f"no listening socket on 127.0.0.1:{port}")


def _hold_a_worker(port: int) -> socket.socket:
    """Occupy one free sync worker: it accepts this connection and waits for a request that never comes.

    After serving, a gunicorn sync worker accepts again before it sleeps, so sequential requests all go
    to one worker; holding one worker makes the other serve, deterministically.
    """
    held = socket.create_connection(("127.0.0.1", port))
    deadline = time.monotonic() + 10
    while _accept_queue(port) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _accept_queue(port) == 0, "no worker accepted the held connection"
    return held


def test_the_eleventh_failed_sign_in_is_refused_whichever_worker_takes_it(two_workers, operator):
    site, access_log = two_workers
    port = int(site.base.rsplit(":", 1)[1])
    site.get("/accounts/login/")  # the CSRF cookie, before any worker is held

    def fail_to_sign_in() -> int:
        return site.post("/accounts/login/", {"username": "olga", "password": "wrong"}, client=ATTACKER)

    first_held = _hold_a_worker(port)  # worker A holds it: worker B answers the first five
    statuses = [fail_to_sign_in() for _ in range(5)]
    second_held = _hold_a_worker(port)  # now B holds one too...
    first_held.close()  # ...and A, freed, answers the other fifteen
    statuses += [fail_to_sign_in() for _ in range(15)]
    second_held.close()

    served = _served_by(access_log, "/accounts/login/")
    workers = Counter(pid for pid, _ in served)
    first, rest = {pid for pid, _ in served[:5]}, {pid for pid, _ in served[5:]}
    print(f"failed sign-ins answered before the first 429: {statuses.index(429) if 429 in statuses else 'none'}; "
          f"requests per worker: {dict(workers)}")  # fmt: skip
    assert len(first) == len(rest) == 1 and first != rest, f"one worker each side: {served}"
    # Counters of their own would let worker A answer ten more after B's five: exactly 10 means one shared count.
    assert statuses == [200] * 10 + [429] * 10, f"statuses {statuses}, workers {dict(workers)}"

    # The operator, signing in from another address, is not locked out by the attack.
    operator_site = Site(site.base)
    assert operator_site.post(
        "/accounts/login/", {"username": "olga", "password": PASSWORD}, client=OPERATOR_ELSEWHERE
    ) == 302  # fmt: skip


def test_the_sixth_public_form_post_is_refused_whichever_worker_takes_it(two_workers):
    site, access_log = two_workers
    statuses = [
        site.post("/design-partners/", {"form": "waitlist", "email": f"w{n}@example.com"}, client=FORM_SENDER)
        for n in range(10)
    ]
    workers = Counter(pid for pid, _ in _served_by(access_log, "/design-partners/"))
    assert statuses == [302] * 5 + [429] * 5, f"statuses {statuses}, workers {dict(workers)}"
    # Another client behind the same proxy still gets through: the limit is per client, not per proxy.
    assert (
        site.post("/design-partners/", {"form": "waitlist", "email": "x@example.com"}, client="192.0.2.1")
        == 302
    )
