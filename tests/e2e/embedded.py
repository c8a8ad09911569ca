"""The embedded console (`make run`) as the e2e tests drive it: SQLite, the filesystem broker, no service."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from jobs import attempt_space

# Attempt spaces take their whole size on the disk when made: a node's default 10 GB of scratch for
# each of a pool's attempts would ask for more than a CI machine's disk holds.
SCRATCH_BYTES = str(256 * 10**6)

ROOT = Path(__file__).resolve().parents[2]


def state_dir_job_uids_can_pass(tag: str) -> Path:
    """Job uids must pass through (never list) the state directory to reach their own folders, which
    pytest's private temporary root (0700, reset by every pytest session) would not allow."""
    state = Path(tempfile.mkdtemp(prefix=f"e31-e2e-{tag}-"))
    state.chmod(0o711)
    return state


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer within {timeout} s")


@dataclass
class Console:
    base: str
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen

    @property
    def state_dir(self) -> Path:
        return Path(self.env["E31_STATE_DIR"])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True,
            check=check,
        )  # fmt: skip

    def api(self, token: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        """One API call; the status and the decoded body, errors included (never raises on 4xx/5xx)."""
        request = urllib.request.Request(
            self.base + "/api/v1" + path,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            try:
                return exc.code, json.loads(text or "{}")
            except ValueError:  # a 500 page is HTML: keep its start for the assertion message
                return exc.code, {"body": text[:300]}


@contextmanager
def embedded_console(tmp_path: Path, **extra_env: str) -> Iterator[Console]:
    """Starts `manage.py run_console` with none of the suite's services, and stops it as Ctrl-C does."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "E31_TEST_DB_NAME")
    }
    state = state_dir_job_uids_can_pass("embedded")
    env.update(E31_STATE_DIR=str(state), PORT=str(free_port()), E31_DEMO_PASSWORD="demo-pass-123",
               E31_HEARTBEAT_S="1", E31_SCHEDULER_TICK_S="2", PYTHONUNBUFFERED="1",
               E31_SCRATCH_BYTES=SCRATCH_BYTES, **extra_env)  # fmt: skip
    log_path = tmp_path / "console.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "run_console"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        console = Console(f"http://127.0.0.1:{env['PORT']}", env, log_path, proc)
        try:
            wait_http(console.base + "/", timeout=180)  # a loaded machine starts five processes slowly
            yield console
        finally:
            proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            attempt_space.release_all(state)  # its agents' attempt filesystems, before the folder goes
            shutil.rmtree(state, ignore_errors=True)


def demo_token(console: Console) -> str:
    return console.manage("create_api_token", "demo").stdout.strip()


def submit_when_the_pool_is_up(console: Console, token: str, body: dict, timeout: float = 60) -> dict:
    """The agents register a moment after the web process answers: 422 until then."""
    deadline = time.monotonic() + timeout
    while True:
        status, job = console.api(token, "POST", "/jobs", body)
        if status in (200, 201):
            return job
        if status != 422 or time.monotonic() > deadline:
            raise AssertionError(f"submission answered {status}: {job}")
        time.sleep(1)
