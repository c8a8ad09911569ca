"""A web process, a Celery worker or beat does not start where its code and the database's migrations disagree.

Each starts as a deployment starts it, in a process of its own, on the test database with one side ahead.
"""

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from django.db import connection

from tests.common.schema_rows import code_newer, database_newer

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]
STARTS = {
    "worker": ["worker", "-Q", "schema-gate-nothing", "--pool", "threads", "-c", "1", "--without-gossip",
               "--without-mingle", "--without-heartbeat"],
    "beat": ["beat", "--schedule", "{tmp}/beat-schedule"],
}  # fmt: skip
# gunicorn as the README starts it, from the checkout, which holds the gunicorn.conf.py it reads
WEB = ["-m", "gunicorn", "e31web.wsgi", "--bind", "127.0.0.1:0", "--workers", "1"]


def _start(what: str, tmp_path) -> subprocess.CompletedProcess:
    args = (
        WEB
        if what == "web"
        else ["-m", "celery", "-A", "e31web", *(a.format(tmp=tmp_path) for a in STARTS[what])]
    )
    return subprocess.run(
        [sys.executable, *args], env=_env(tmp_path), cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def _env(tmp_path) -> dict[str, str]:
    db = connection.settings_dict
    env = {**os.environ, "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "E31_STATE_DIR": str(tmp_path / "state")}  # fmt: skip
    env.pop("E31_TEST_DB_NAME", None)
    return env


@pytest.mark.parametrize("what", ["worker", "beat", "web"])
def test_it_does_not_start_against_a_database_migrated_by_newer_code(what, tmp_path):
    with database_newer() as future:
        done = _start(what, tmp_path)
    assert done.returncode != 0
    assert (
        f"{what} not started: the database has migrations this code does not know: {future}; "
        "upgrade this machine's checkout"
    ) in done.stdout + done.stderr


@pytest.mark.parametrize("what", ["worker", "web"])
def test_it_does_not_start_against_a_database_not_yet_migrated(what, tmp_path):
    with code_newer() as latest:
        done = _start(what, tmp_path)
    assert done.returncode != 0
    assert (
        f"{what} not started: this code has migrations the database lacks: {latest}; "
        "run `python manage.py migrate` first"
    ) in done.stdout + done.stderr


def test_the_web_starts_and_serves_where_code_and_database_agree(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    web = subprocess.Popen(
        [sys.executable, *WEB[:3], "--bind", f"127.0.0.1:{port}", "--workers", "1"],
        env=_env(tmp_path), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and web.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
                    assert answer.status == 200
                    return
            except OSError:
                time.sleep(0.2)
        pytest.fail(f"the web never answered: {web.poll()=}")
    finally:
        web.terminate()
        web.wait(timeout=30)
