"""A Celery worker or beat does not start where its code and the database's migrations disagree.

Each starts as a deployment starts it, in a process of its own, on the test database with one side ahead.
"""

import os
import subprocess
import sys
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


def _start(what: str, tmp_path) -> subprocess.CompletedProcess:
    db = connection.settings_dict
    env = {**os.environ, "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "E31_STATE_DIR": str(tmp_path / "state")}  # fmt: skip
    env.pop("E31_TEST_DB_NAME", None)
    args = [arg.format(tmp=tmp_path) for arg in STARTS[what]]
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "e31web", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("what", ["worker", "beat"])
def test_it_does_not_start_against_a_database_migrated_by_newer_code(what, tmp_path):
    with database_newer() as future:
        done = _start(what, tmp_path)
    assert done.returncode != 0
    assert (
        f"{what} not started: the database has migrations this code does not know: {future}; "
        "upgrade this machine's checkout"
    ) in done.stdout + done.stderr


def test_a_worker_does_not_start_against_a_database_not_yet_migrated(tmp_path):
    with code_newer() as latest:
        done = _start("worker", tmp_path)
    assert done.returncode != 0
    assert (
        f"worker not started: this code has migrations the database lacks: {latest}; "
        "run `python manage.py migrate` first"
    ) in done.stdout + done.stderr
