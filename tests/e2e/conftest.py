"""A real pool for end-to-end tests: a Celery control worker, beat and node agents on Redis.

Each test gets its own processes, queues and directories, pointed at the test database, with
timeouts compressed to seconds (heartbeat 0.5 s, node timeout 3 s, kill grace 1 s).
"""

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.conf import settings as django_settings
from django.db import connection

from jobs import attempt_space
from jobs.models import Job, Node, OutputTransfer
from tests.e2e.embedded import SCRATCH_BYTES, state_dir_job_uids_can_pass

ROOT = Path(__file__).resolve().parents[2]
COMPRESSED = {
    "E31_HEARTBEAT_S": "0.5",
    "E31_NODE_TIMEOUT_S": "3",
    "E31_KILL_GRACE_S": "1",
    "E31_RECONCILE_AFTER_S": "6",
    "E31_RECONCILE_EVERY_S": "1",
    "E31_SCHEDULER_TICK_S": "2",
    "E31_ACCRUE_EVERY_S": "2",
    "E31_LOG_CAP_BYTES": "1000000",
    "E31_ATTEMPT_RETENTION_S": "2",
}


LOG_LINES_ON_FAILURE = 40
UIDS_PER_AGENT = 16
AGENTS_PER_POOL = 4  # the two a pool starts and the spares a fault test adds (e2e-<tag>-1 .. -4)


@dataclass
class LivePool:
    tag: str
    env: dict[str, str]
    nodes: list[str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        log = open(Path(self.env["E31_STATE_DIR"]) / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen(
            cmd, env={**self.env, **(env or {})}, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )

    def start_agent(
        self,
        node: str,
        gpus: int = 4,
        *,
        gpu_args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """``gpu_args`` replaces ``--virtual-gpus N`` (``[]``: the GPUs the agent finds, as on a GPU machine)."""
        gpu_args = ["--virtual-gpus", str(gpus)] if gpu_args is None else gpu_args
        self.start(node, [sys.executable, "manage.py", "node_agent", "--name", node, *gpu_args,
                          "--uid-base", str(self.uid_base(node)), "--uid-count", str(UIDS_PER_AGENT)], env)  # fmt: skip

    def uid_base(self, node: str) -> int:
        """A range of job uids per agent, apart from other test runs on this machine (one per tag)."""
        number = int(node.rsplit("-", 1)[1])
        assert 1 <= number <= AGENTS_PER_POOL, (
            f"{node}: a pool's agents are e2e-<tag>-1 .. -{AGENTS_PER_POOL}"
        )
        return 300000 + ((int(self.tag, 16) % 10000) * AGENTS_PER_POOL + number - 1) * UIDS_PER_AGENT

    def kill(self, name: str) -> None:
        """SIGKILL, as a crashed machine would: no clean-up of any kind."""
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()

    def log(self, name: str) -> str:
        return (Path(self.env["E31_STATE_DIR"]) / f"{name}.log").read_text(errors="replace")

    def tail(self, name: str, lines: int) -> str:
        path = Path(self.env["E31_STATE_DIR"]) / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def tails(self, lines: int) -> list[tuple[str, str]]:
        """(section title, text): each process's last ``lines`` lines."""
        return [(f"pool: {name} (last {lines} lines)", self.tail(name, lines)) for name in self.procs]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing end-to-end test's report carries what the pool was doing: each process's last lines and
    every job's state and delivery, since the processes and their logs are gone once the test ends."""
    report = yield
    # A fixture that waits on the pool (a node to register) fails the setup: its report needs the logs as much.
    pool = item.funcargs.get("live_pool") if report.when in ("setup", "call") and report.failed else None
    if isinstance(pool, LivePool):
        try:
            report.sections.extend(pool.tails(LOG_LINES_ON_FAILURE))
            report.sections.append(("pool: jobs and deliveries", _jobs_and_deliveries()))
        except Exception as exc:  # what the pool did is extra: it must never hide the failure itself
            report.sections.append(("pool: could not be read", repr(exc)))
    return report


def _jobs_and_deliveries() -> str:
    jobs = Job.objects.order_by("id").values_list(
        "id", "name", "state", "attempt", "delivery_state", "delivery_detail"
    )
    transfers = OutputTransfer.objects.order_by("id").values_list(
        "allocation__job_id", "allocation__attempt", "state", "token", "updated_at", "detail"
    )
    return "\n".join([*(f"job {row}" for row in jobs), *(f"transfer {row}" for row in transfers)])


def wait_for(predicate, *, timeout: float = 30, every: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := predicate():
            return result
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_for_state(job_id: int, *states: str, timeout: float = 40) -> Job:
    return wait_for(
        lambda: Job.objects.filter(id=job_id, state__in=states).first(), timeout=timeout,
        what=f"job {job_id} to reach {states} (now {Job.objects.filter(id=job_id).values_list('state', flat=True).first()})",
    )  # fmt: skip


@pytest.fixture
def live_pool(request, transactional_db, settings, tmp_path):
    """The pool; ``indirect`` parameters: ``roots_outside_tmp`` puts the data and output roots and the
    secret files (SECRET_KEY_FILE, DATABASE_URL_FILE) under /var/tmp, as an operator might."""
    if not django_settings.CELERY_BROKER_URL.startswith("redis://"):
        pytest.fail("end-to-end tests need CELERY_BROKER_URL=redis://… (make test sets it)")
    options = getattr(request, "param", {})
    tag = uuid.uuid4().hex[:6]
    state = state_dir_job_uids_can_pass(tag)
    request.addfinalizer(lambda: shutil.rmtree(state, ignore_errors=True))
    outside = Path(f"/var/tmp/e31-e2e-{tag}") if options.get("roots_outside_tmp") else tmp_path
    data, outputs = outside / "datasets", outside / "outputs"
    for path in (data, outputs):
        path.mkdir(parents=True)
    db = connection.settings_dict
    database_url = f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    env = {
        **os.environ, **COMPRESSED, "DATABASE_URL": database_url,
        "E31_CONTROL_QUEUE": f"control-{tag}", "E31_STATE_DIR": str(state),
        "E31_DATA_ROOTS": str(data), "E31_OUTPUT_ROOTS": str(outputs),
        "SECRET_KEY": "e2e-secret-never-visible-to-jobs", "PYTHONUNBUFFERED": "1",
        "E31_JOB_SUBNET": "100.64.0.0/10",  # the default range: every pool node gets a /24 slot of its own
        "E31_SECRETS_KEYS": Fernet.generate_key().decode(),  # the agents decrypt what this process encrypts
        "E31_SCRATCH_BYTES": os.environ.get("E31_SCRATCH_BYTES", SCRATCH_BYTES),  # a test's own first
    }  # fmt: skip
    if options.get("roots_outside_tmp"):
        (outside / "secrets").mkdir(mode=0o700)
        for name, value in (("SECRET_KEY", env.pop("SECRET_KEY")), ("DATABASE_URL", env.pop("DATABASE_URL"))):
            (outside / "secrets" / name).write_text(value)
            env[f"{name}_FILE"] = str(outside / "secrets" / name)
        request.addfinalizer(lambda: shutil.rmtree(outside, ignore_errors=True))
    env.pop("E31_TEST_DB_NAME", None)
    settings.CELERY_TASK_DEFAULT_QUEUE = env["E31_CONTROL_QUEUE"]
    settings.E31_DATA_ROOTS, settings.E31_OUTPUT_ROOTS = [data.resolve()], [outputs.resolve()]
    settings.E31_STAGING_ROOT = (state / "staging").resolve()
    settings.E31_AGENT_ROOT = (state / "agents").resolve()
    settings.E31_CHECKPOINT_ROOT = (
        state / "checkpoints"
    ).resolve()  # the agents' default under E31_STATE_DIR
    settings.E31_MAX_ATTEMPTS = 3
    settings.E31_JOB_SUBNET = env["E31_JOB_SUBNET"]
    settings.E31_SECRETS_KEYS = [env["E31_SECRETS_KEYS"]]
    pool = LivePool(tag=tag, env=env, nodes=[f"e2e-{tag}-1", f"e2e-{tag}-2"])
    celery = [sys.executable, "-m", "celery", "-A", "e31web"]
    # One worker for the control, staging and notification queues, which deployments serve apart
    # (dispatch.staging_queue, dispatch.notify_queue): two processes fewer for each test.
    queues = ",".join(f"{env['E31_CONTROL_QUEUE']}{tail}" for tail in ("", ".staging", ".notify"))
    pool.start("worker", [*celery, "worker", "-Q", queues, "--pool", "threads", "-c", "4",
                          "-n", f"control-{tag}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"])  # fmt: skip
    pool.start("beat", [*celery, "beat", "--schedule", str(state / "beat-schedule")])
    for node in pool.nodes:
        pool.start_agent(node)
    try:
        try:
            wait_for(
                lambda: Node.objects.filter(name__in=pool.nodes, state="up").count() == 2,
                timeout=90,  # Django and Celery start slowly on a loaded two-core machine
                what="agents to register",
            )
        # A failed setup: the report's hook has no pool to read then, so the error itself carries the logs.
        except AssertionError as exc:
            told = "\n".join(f"--- {title}\n{text}" for title, text in pool.tails(LOG_LINES_ON_FAILURE))
            raise AssertionError(f"{exc}\n{told}") from None
        yield pool
    finally:
        pool.stop()
        attempt_space.release_all(state)  # the agents' attempt filesystems, before tmp_path goes
