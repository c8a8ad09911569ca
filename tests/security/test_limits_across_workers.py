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
        sys.executable, "-m", "gunicorn", "e31web.wsgi", "--workers", "2", "--bind", f"127.0.0.1:{port}",
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


def test_the_eleventh_failed_sign_in_is_refused_whichever_worker_takes_it(two_workers, operator):
    site, access_log = two_workers
    statuses = [
        site.post("/accounts/login/", {"username": "olga", "password": "wrong"}, client=ATTACKER)
        for _ in range(20)
    ]
    served = _served_by(access_log, "/accounts/login/")
    for _ in range(
        60
    ):  # the kernel may hand one worker every connection: ask on until the other serves one too
        if len({pid for pid, _ in served}) == 2:
            break
        statuses.append(
            site.post("/accounts/login/", {"username": "olga", "password": "wrong"}, client=ATTACKER)
        )
        served = _served_by(access_log, "/accounts/login/")
    workers = Counter(pid for pid, _ in served)
    print(f"failed sign-ins answered before the first 429: {statuses.index(429) if 429 in statuses else 'none'}; "
          f"requests per worker: {dict(workers)}")  # fmt: skip
    assert statuses == [200] * 10 + [429] * (len(statuses) - 10), (
        f"statuses {statuses}, workers {dict(workers)}"
    )
    # With both workers taking some of them, counters of their own would let more than 10 through
    # (each allows up to 10): exactly 10 means one shared count, whichever worker took the refusals.
    assert len(workers) == 2, f"both workers took sign-ins: {dict(workers)}"

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
