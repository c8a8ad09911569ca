"""The API's job list stays fast as a team's history grows: GET /api/v1/jobs at 1,000 and at 100,000 jobs.

    DATABASE_URL=postgres://e31:e31@127.0.0.1:5432/e31 .venv/bin/python bench/api_list.py [--requests N] [--keep]

Creates a throwaway database (``bench_e31_api_list``, or $E31_BENCH_DB_NAME) with the test runner's
machinery, so the schema and indexes are exactly the migrations'. Rows are bulk-created, bypassing the
services: each job has one data input and two events, one in ten is still queued. A first team gets
1,000 jobs and its first page (limit 50, the way a script or ``e31 ls`` asks) is timed server-side
through the Django test client with a member's Bearer token (``jobs_1k_alone_ms``: the table holds
nothing else). Then a second team gets 100,000 jobs, and the two members' requests are timed in
turn, one after the other, so that a busy machine slows both alike: ``jobs_1k_ms`` and
``jobs_100k_ms`` are those medians and ``ratio`` theirs. The goal is a ratio of at most 2.
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
os.environ["E31_TEST_DB_NAME"] = os.environ.get("E31_BENCH_DB_NAME", "bench_e31_api_list")

import django

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402

from accounts import services as accounts  # noqa: E402
from accounts.models import Membership, Team  # noqa: E402
from jobs.models import DataInput, Job, JobEvent  # noqa: E402

SMALL, LARGE, BATCH, PAGE = 1_000, 100_000, 5_000, 50
NOW = datetime.now(UTC).replace(microsecond=0)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def member_client(team: Team) -> Client:
    user = get_user_model().objects.create_user(f"member-of-{team.slug}")
    Membership.objects.create(team=team, user=user)
    _, token = accounts.create_api_token(user=user, label="bench")
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def job(i: int, team: Team) -> Job:
    queued = i % 10 == 0
    return Job(
        team=team, name=f"sweep-{i:06d}", state="queued" if queued else "released",
        end_reason="" if queued else "succeeded", exit_code=None if queued else 0, gpus=1 + i % 8, hours=2.0,
        submitted_at=NOW - timedelta(seconds=LARGE - i), state_changed_at=NOW, argv=["python", "train.py"],
        output_uri="file:///tmp/out", output_bytes=0,
    )  # fmt: skip


def load(team: Team, start: int, stop: int) -> None:
    for first in range(start, stop, BATCH):
        jobs = Job.objects.bulk_create(job(i, team) for i in range(first, min(stop, first + BATCH)))
        DataInput.objects.bulk_create(
            DataInput(job=j, position=0, name="corpus", uri="s3://bucket/corpus", bytes=10**9) for j in jobs
        )
        JobEvent.objects.bulk_create(
            JobEvent(job=j, from_state=a, to_state=b, at=j.submitted_at)
            for j in jobs
            for a, b in (("", "submitted"), ("submitted", "queued"))
        )
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE") if connection.vendor == "postgresql" else cursor.execute("ANALYZE")


def get_page(client: Client) -> float:
    began = time.perf_counter()
    response = client.get(f"/api/v1/jobs?limit={PAGE}")
    took = time.perf_counter() - began
    assert response.status_code == 200 and len(response.json()["items"]) == PAGE, response.status_code
    return took


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 1)


def time_lists(clients: list[Client], requests: int) -> list[float]:
    """Median per client, their requests taken in turn (a, b, a, b, ...) after a warm-up."""
    for _ in range(5):
        for client in clients:
            get_page(client)  # warm: connection open, caches filled, as a running server would be
    took: list[list[float]] = [[] for _ in clients]
    for _ in range(requests):
        for samples, client in zip(took, clients, strict=True):
            samples.append(get_page(client))
    return [median_ms(samples) for samples in took]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--keep", action="store_true", help="keep the bench database afterwards")
    args = parser.parse_args()
    old = setup_databases(verbosity=0, interactive=False, keepdb=False)
    try:
        small, large = (Team.objects.create(name=n, slug=n) for n in ("small-team", "large-team"))
        small_client, large_client = member_client(small), member_client(large)
        load(small, LARGE - SMALL, LARGE)
        [alone_ms] = time_lists([small_client], args.requests)
        began = time.perf_counter()
        load(large, 0, LARGE)
        log(f"loaded {Job.objects.count()} jobs in {time.perf_counter() - began:.0f} s")
        small_ms, large_ms = time_lists([small_client, large_client], args.requests)
        summary = {
            "jobs_1k_ms": small_ms, "jobs_100k_ms": large_ms, "ratio": round(large_ms / small_ms, 2),
            "jobs_1k_alone_ms": alone_ms, "page": PAGE, "requests": args.requests, "goal_ratio": 2,
            "db": connection.vendor,
        }  # fmt: skip
    finally:
        if not args.keep:
            teardown_databases(old, verbosity=0)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
