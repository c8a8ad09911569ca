"""Pushes 200 trivial jobs through the whole pipeline on a local pool and measures the overhead.

    DATABASE_URL=postgres://… CELERY_BROKER_URL=redis://… python bench/pipeline.py [--jobs 200]

A throwaway test database, a control worker, beat and two node agents (4 virtual GPUs each, jobs
in bubblewrap) are started as in the end-to-end tests. Jobs are submitted closed-loop, at most as
many in flight as the pool has GPUs, so the figure is the pipeline's own overhead, not queueing.
Overhead = (RELEASE - SUBMIT) - (process exit - process start). Last line: JSON.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "e31web.settings")
os.environ.setdefault("E31_TEST_DB_NAME", "test_e31_bench_pipeline")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402
from django.utils import timezone  # noqa: E402

from accounts import services as accounts  # noqa: E402
from jobs import declaration, services  # noqa: E402
from jobs.models import Job, Node  # noqa: E402
from tests.e2e.conftest import COMPRESSED, LivePool, wait_for  # noqa: E402


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def start_pool(tmp: Path) -> LivePool:
    db = connection.settings_dict
    state, pool_root = tmp / "state", tmp / "pool"  # side by side: no root may hold the platform's folders
    state.mkdir()
    pool_root.mkdir()
    env = {
        **os.environ, **COMPRESSED, "E31_RECONCILE_AFTER_S": "30",
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "E31_CONTROL_QUEUE": "control-bench", "E31_STATE_DIR": str(state),
        "E31_DATA_ROOTS": str(pool_root), "E31_OUTPUT_ROOTS": str(pool_root),
    }  # fmt: skip
    env.pop("E31_TEST_DB_NAME", None)
    settings.CELERY_TASK_DEFAULT_QUEUE = "control-bench"
    settings.E31_OUTPUT_ROOTS = [pool_root.resolve()]
    pool = LivePool(tag="bench", env=env, nodes=["bench-1", "bench-2"])
    celery = [sys.executable, "-m", "celery", "-A", "e31web"]
    pool.start("stager", [*celery, "worker", "-Q", "control-bench.staging", "--pool", "threads", "-c", "5", "-n", "staging-bench@%h",
                          "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING"])  # fmt: skip
    pool.start("worker", [*celery, "worker", "-Q", "control-bench", "--pool", "threads", "-c", "4", "-n", "control-bench@%h",
                          "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING"])  # fmt: skip
    pool.start("beat", [*celery, "beat", "--schedule", str(state / "beat")])
    for node in pool.nodes:
        pool.start_agent(node)
    wait_for(lambda: Node.objects.filter(state="up").count() == 2, timeout=60, what="agents")
    return pool


def run(jobs: int) -> dict:
    user = accounts.ensure_demo_accounts(password="bench") and None
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.get(username="demo")
    team = user.memberships.first().team
    spec = declaration.validate(
        {"name": "trivial", "work": {"argv": ["/bin/true"]}, "request": {"gpus": 1, "hours": 1},
         "output": {"uri": f"file://{settings.E31_OUTPUT_ROOTS[0]}/{team.slug}/out", "bytes": 0}},
        limits=services.pool_limits(team=team),
    )  # fmt: skip
    in_flight, submitted, began = 8, [], time.monotonic()
    while len(submitted) < jobs or Job.objects.exclude(state__in=("released", "ended")).exists():
        alive = Job.objects.exclude(state__in=("released", "ended")).count()
        for _ in range(min(in_flight - alive, jobs - len(submitted))):
            submitted.append(services.submit_job(team=team, user=user, spec=spec, now=timezone.now()).id)
        time.sleep(0.02)
        if time.monotonic() - began > 900:
            raise SystemExit("the pipeline did not finish 200 jobs in 15 minutes")
    elapsed = time.monotonic() - began
    overheads = []
    for job in Job.objects.filter(id__in=submitted).prefetch_related("allocations", "events"):
        released = max(e.at for e in job.events.all())
        part = job.allocations.get()
        run_s = (part.finished_at - part.started_at).total_seconds()
        overheads.append((released - job.submitted_at).total_seconds() - run_s)
    ok = Job.objects.filter(id__in=submitted, end_reason="succeeded").count()
    return {
        "jobs": len(submitted), "succeeded": ok,
        "p50_overhead_s": round(statistics.median(overheads), 3), "p95_overhead_s": round(percentile(overheads, 95), 3),
        "jobs_per_min": round(len(submitted) / elapsed * 60, 1), "in_flight": in_flight,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    args = parser.parse_args()
    if not settings.CELERY_BROKER_URL.startswith("redis://") or connection.vendor != "postgresql":
        raise SystemExit("set DATABASE_URL (PostgreSQL) and CELERY_BROKER_URL (redis://)")
    old = setup_databases(verbosity=0, interactive=False)
    pool = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            pool = start_pool(Path(tmp))
            result = run(args.jobs)
            pool.stop()
            pool = None
    finally:
        if pool:
            pool.stop()
        teardown_databases(old, verbosity=0)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
