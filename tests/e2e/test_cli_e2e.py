"""The `e31` command against a live console: gunicorn on loopback, a control worker, beat and two agents."""

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from accounts import services as accounts
from jobs.models import Allocation, Job
from tests.e2e.conftest import ROOT, LivePool, wait_for
from tests.factories import JobFactory, MembershipFactory, NodeFactory, TeamFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
E31 = [sys.executable, "-m", "e31cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_web(pool) -> str:
    port = free_port()
    pool.start(
        "web",
        [
            sys.executable,
            "-m",
            "gunicorn",
            "e31web.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
            "--threads",
            "4",
        ],
    )  # fmt: skip  (what `make run` starts)
    base = f"http://127.0.0.1:{port}"
    wait_for(
        lambda: _answers(base + "/api/v1/openapi.json"), timeout=120, every=0.5, what="gunicorn to answer"
    )
    return base


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5)
        return True
    except urllib.error.HTTPError:
        return True  # it answered
    except OSError:
        return False


@pytest.fixture
def console(live_pool, tmp_path):
    """The live console's address, and a member's token; the CLI keeps its login under tmp_path."""
    base = start_web(live_pool)
    user = MembershipFactory(
        team=TeamFactory(name="vision", slug="vision"), user=UserFactory(username="alice")
    ).user
    _, token = accounts.create_api_token(user=user, label="cli")
    env = {k: v for k, v in os.environ.items() if not k.startswith("E31_URL") and k != "E31_TOKEN"}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "config"), PYTHONUNBUFFERED="1")
    return base, token, env, Path(live_pool.env["E31_OUTPUT_ROOTS"])


def e31(env: dict, *args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            [*E31, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        jobs = list(Job.objects.values_list("id", "name", "state", "end_reason", "pending_reason"))
        raise AssertionError(
            f"e31 {' '.join(args)} still running after {timeout} s; jobs: {jobs}; {exc.stderr}"
        ) from exc


def job_file(path: Path, outputs: Path, name: str, code: str) -> Path:
    path.write_text(
        f'name = "{name}"\n[work]\nargv = ["/usr/bin/python3", "-c", {json.dumps(code)}]\n'
        f'[request]\ngpus = 1\nhours = 0.5\n[output]\nuri = "file://{outputs}/vision/{name}"\nbytes = "1 MB"\n'
    )
    return path


def test_login_submit_follow_the_whole_log_exit_code_outputs_and_a_retried_submit(console, tmp_path):
    base, token, env, outputs = console
    login = e31(env, "login", base, "--token", token)
    assert login.returncode == 0, login.stderr
    stored = Path(env["XDG_CONFIG_HOME"]) / "e31" / "login.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600 and json.loads(stored.read_text())["url"] == base

    code = (
        "import os, sys; [print(f'line {i}') for i in range(3000)]; "
        "open(os.environ['E31_OUTPUT_DIR'] + '/result.txt', 'w').write('42'); sys.exit(3)"
    )
    run = e31(env, "submit", str(job_file(tmp_path / "train.toml", outputs, "cli-train", code)), "--follow")
    assert run.returncode == 3, run.stderr  # --follow waits, then exits with the job's own exit code
    assert run.stdout.splitlines() == [f"line {i}" for i in range(3000)]  # the whole log, not an 8 KB tail
    job = Job.objects.get(name="cli-train")
    assert (job.state, job.end_reason, job.exit_code) == ("released", "failed", 3)

    got = e31(env, "outputs", str(job.id), "--download", str(tmp_path / "got"))
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "got" / "result.txt").read_text() == "42"

    ok = job_file(tmp_path / "ok.toml", outputs, "cli-ok", "print('fine')")
    first = e31(env, "submit", str(ok), "--key", "nightly-7")
    again = e31(env, "submit", str(ok), "--key", "nightly-7")
    assert first.returncode == again.returncode == 0 and first.stdout == again.stdout
    assert (
        "already submitted with this key" in again.stderr and Job.objects.filter(name="cli-ok").count() == 1
    )
    waited = e31(env, "submit", str(ok), "--wait")  # a new key: a second job, which succeeds
    assert waited.returncode == 0 and Job.objects.filter(name="cli-ok").count() == 2

    listed = e31(env, "ls", "--name", "cli-", "--json")
    assert {json.loads(line)["name"] for line in listed.stdout.splitlines()} == {"cli-train", "cli-ok"}
    assert e31(env, "logs", str(job.id)).stdout.splitlines()[-1] == "line 2999"
    assert e31(env, "cancel", str(job.id)).returncode == 5  # already ended: nothing to cancel
    assert e31(env, "show", "999999").returncode == 4
    assert e31({**env, "E31_TOKEN": "not-a-token"}, "ls").returncode == 3  # the environment wins


@pytest.fixture
def web_only(transactional_db, tmp_path):
    """gunicorn alone on the test database: no agent or reconciler to end the job being followed."""
    db = connection.settings_dict
    env = {
        **os.environ, "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "E31_STATE_DIR": str(tmp_path), "SECRET_KEY": "e2e-web-only", "PYTHONUNBUFFERED": "1",
    }  # fmt: skip
    env.pop("E31_TEST_DB_NAME", None)
    pool = LivePool(tag="web", env=env, nodes=[])
    try:
        yield start_web(pool)
    finally:
        pool.stop()


def test_ten_log_followers_leave_the_pages_as_fast(web_only):
    """Ten terminals follow a quiet log for 15 s, as `e31 logs -f` does; pages keep their usual speed."""
    base = web_only
    user = MembershipFactory(team=TeamFactory(name="nlp", slug="nlp"), user=UserFactory(username="nora")).user
    _, token = accounts.create_api_token(user=user, label="follow")
    job = JobFactory(team=user.memberships.get().team, state="running", attempt=1)
    Allocation.objects.create(
        job=job, attempt=1, node=NodeFactory(), gpu_indices=[0], rented_at=timezone.now()
    )
    headers = {"Authorization": f"Bearer {token}"}

    def get(path: str) -> tuple[float, dict | None]:
        began = time.monotonic()
        request = urllib.request.Request(base + path, headers=headers)
        body = urllib.request.urlopen(request, timeout=60).read()
        return time.monotonic() - began, json.loads(body) if path.startswith("/api/v1/jobs/") else None

    held = []

    def follow() -> None:
        until = time.monotonic() + 15
        while time.monotonic() < until:
            took, body = get(f"/api/v1/jobs/{job.id}/log?wait=15")
            held.append(took)
            time.sleep(body["retry_after_s"])

    pages = ["/api/v1/jobs?limit=5", f"/api/v1/jobs/{job.id}", "/"]
    before = sorted(get(p)[0] for _ in range(5) for p in pages)
    followers = [threading.Thread(target=follow, daemon=True) for _ in range(10)]
    for f in followers:
        f.start()
    time.sleep(1.0)  # every follower has reached the console
    during = sorted(get(p)[0] for _ in range(5) for p in pages)
    for f in followers:
        f.join(timeout=60)
    median_before, median_during = before[len(before) // 2], during[len(during) // 2]
    print(json.dumps({"page_median_before_s": round(median_before, 3), "page_median_during_s": round(median_during, 3),
                      "page_max_during_s": round(during[-1], 3), "long_polls_held": sum(t > 10 for t in held)}))  # fmt: skip
    assert sum(t > 10 for t in held) >= 2  # followers really were waiting while the pages were timed
    assert during[-1] < 5, during  # no page waited for a follower's 15 s
    assert median_during < max(3 * median_before, median_before + 0.25), (before, during)
