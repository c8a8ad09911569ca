"""The operator pages at scale: 1,000 nodes, 100,000 jobs and a day of utilisation samples.

    DATABASE_URL=postgres://e31:e31@127.0.0.1:5432/e31 .venv/bin/python bench/operator_pages.py [--requests N] [--keep]

Creates a throwaway database (``bench_e31_operator``, or $E31_BENCH_DB_NAME) with the test runner's
machinery, so the schema and indexes are exactly the migrations'. Rows are bulk-created, bypassing
the services: 1,000 8-GPU nodes, each with three running jobs holding 5 of its GPUs; 100,000 jobs
in all (10,000 waiting with the scheduler's priority and estimate, the rest released or ended);
1,440 minute samples over 20 teams. Then it times the pool, queue and utilisation pages
server-side through the Django test client as an operator (whole page, as a first visit does),
after a few warm-up requests, as a running server would be. The last line printed is JSON:
p50 and p95 per page, in milliseconds. The goal is a p95 under 150 ms each.
"""

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "e31web.settings")
# Never the test suite's database: the bench creates and drops its own.
os.environ["E31_TEST_DB_NAME"] = os.environ.get("E31_BENCH_DB_NAME", "bench_e31_operator")

import django

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402
from django.urls import reverse  # noqa: E402

from accounts.models import Team  # noqa: E402
from common import schema  # noqa: E402
from jobs.models import Allocation, GpuHold, Job, Node  # noqa: E402
from operations import utilisation  # noqa: E402
from operations.models import TeamBusySample, UtilisationSample  # noqa: E402

NODES, GPUS, JOBS, TEAMS, WAITING = 1000, 8, 100_000, 20, 10_000
# Per node: three running jobs holding GPUs (0, 1), (2, 3) and (4); GPUs 5-7 free.
SLICES = ((0, 1), (2, 3), (4,))
BATCH = 5000
NOW = datetime.now(UTC).replace(second=0, microsecond=0)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def job(i: int, teams: list[Team], state: str, **fields) -> Job:
    return Job(
        team=teams[i % TEAMS], name=f"job-{i}", state=state, gpus=fields.pop("gpus", 1 + i % 8),
        hours=4.0, submitted_at=NOW - timedelta(seconds=30 * i), state_changed_at=NOW, argv=["train"],
        output_uri="file:///tmp/out", output_bytes=0, **fields,
    )  # fmt: skip


def waiting(i: int, teams: list[Team]) -> Job:
    detail = {"fairshare": 0.5, "age": i / 10_000, "size": 0.2, "total": 0.7 + i / 10_000, "starved": 0.0}
    return job(
        i, teams, "queued", priority=detail["total"], priority_detail=detail,
        estimated_start=NOW + timedelta(minutes=i), pending_reason="needs 8 GPUs on one node; not enough idle GPUs yet",
    )  # fmt: skip


def create_pool() -> None:
    teams = Team.objects.bulk_create(Team(name=f"team-{i:02d}", slug=f"team-{i:02d}") for i in range(TEAMS))
    nodes = Node.objects.bulk_create(
        Node(name=f"gpu-{i:04d}", gpus=GPUS, gpu_model="h100", agent_version=schema.code().version, last_heartbeat=NOW,
             sandbox="none" if i % 100 == 0 else "bubblewrap", registered_at=NOW, state_changed_at=NOW)
        for i in range(NODES)
    )  # fmt: skip
    running = Job.objects.bulk_create(
        (job(i, teams, "running", gpus=len(SLICES[i % 3]), attempt=1) for i in range(NODES * 3)),
        batch_size=BATCH,
    )
    allocations = Allocation.objects.bulk_create(
        (
            Allocation(job=j, attempt=1, node=nodes[i // 3], gpu_indices=list(SLICES[i % 3]), rented_at=NOW,
                       started_at=NOW)
            for i, j in enumerate(running)
        ),
        batch_size=BATCH,
    )  # fmt: skip
    GpuHold.objects.bulk_create(
        (GpuHold(allocation=a, node=a.node, gpu_index=g) for a in allocations for g in a.gpu_indices),
        batch_size=BATCH,
    )
    Job.objects.bulk_create((waiting(i, teams) for i in range(WAITING)), batch_size=BATCH)
    ended = JOBS - len(running) - WAITING
    Job.objects.bulk_create(
        (job(i, teams, "released", end_reason="succeeded", attempt=1) for i in range(ended)), batch_size=BATCH
    )
    create_samples(teams, nodes)


def create_samples(teams: list[Team], nodes: list[Node]) -> None:
    first = utilisation.minute_of(NOW - timedelta(days=1))
    reservations = {"1": {"start_at": NOW.isoformat(), "gpus_by_node": {nodes[0].name: [5, 6, 7]}}}
    samples = UtilisationSample.objects.bulk_create(
        (
            UtilisationSample(
                minute=m, at=utilisation.at_minute(m), total_gpus=NODES * GPUS, busy_gpus=NODES * 5 - (m % 60),
                reserved_gpus=24, idle_while_waiting_gpus=m % 60, queued_jobs=WAITING, reservations=reservations,
            )
            for m in range(first, first + 1440)
        ),
        batch_size=BATCH,
    )  # fmt: skip
    TeamBusySample.objects.bulk_create(
        (
            TeamBusySample(sample=s, minute=s.minute, team=t, busy_gpus=NODES * 5 // TEAMS)
            for s in samples
            for t in teams
        ),
        batch_size=BATCH,
    )


def p(samples: list[float], q: int) -> float:
    return round(statistics.quantiles(samples, n=100, method="inclusive")[q - 1] * 1000, 1)


def time_page(client: Client, url: str, requests: int) -> dict:
    for _ in range(3):
        client.get(url)  # warm: templates compiled, connection open, as a running server would be
    took = []
    for _ in range(requests):
        began = time.perf_counter()
        response = client.get(url)
        took.append(time.perf_counter() - began)
        assert response.status_code == 200, (url, response.status_code)
    return {
        "p50_ms": round(statistics.median(took) * 1000, 1),
        "p95_ms": p(took, 95),
        "bytes": len(response.content),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--keep", action="store_true", help="keep the bench database afterwards")
    args = parser.parse_args()
    old = setup_databases(verbosity=0, interactive=False, keepdb=False)
    try:
        began = time.perf_counter()
        create_pool()
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        load_s = time.perf_counter() - began
        log(
            f"loaded {Job.objects.count()} jobs, {Node.objects.count()} nodes, {GpuHold.objects.count()} holds in {load_s:.1f} s"
        )
        operator = get_user_model().objects.create_user("bench-operator", is_staff=True)
        client = Client()
        client.force_login(operator)
        pages = {name: reverse(f"operations:{name}") for name in ("pool", "queue", "utilisation")}
        result = {name: time_page(client, url, args.requests) for name, url in pages.items()}
        log(json.dumps(result, indent=1))
        summary = {
            "nodes": Node.objects.count(), "jobs": Job.objects.count(),
            "samples": UtilisationSample.objects.count(), "requests": args.requests,
            **{f"{name}_{k}": v for name, r in result.items() for k, v in r.items() if k != "bytes"},
            "goal_p95_ms": 150, "db": connection.vendor, "load_s": round(load_s, 1),
        }  # fmt: skip
    finally:
        if not args.keep:
            teardown_databases(old, verbosity=0)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
