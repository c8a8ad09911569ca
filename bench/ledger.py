"""The ledger at scale: 1,000,000 rows over 50 teams and 12 months, read the way the pages read it.

    DATABASE_URL=postgres://e31:e31@127.0.0.1:5432/e31 .venv/bin/python bench/ledger.py [--rows N] [--keep]

Creates a throwaway database (``bench_e31_ledger``, or $E31_BENCH_DB_NAME) with the test runner's
machinery, so the schema, indexes and append-only trigger are exactly the migrations'. Rows are
loaded with COPY, bypassing the services for speed, but every allocation's rows tile its
RENT..RELEASE exactly (``find_violations`` would pass). Then it times, over random team-months:
the month statement (total and per-job breakdown), the daily chart query, and a full-year CSV
export streamed through the real view. The last line printed is JSON.
"""

import argparse
import json
import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "e31web.settings")
# Never the test suite's database: the bench creates and drops its own.
os.environ["E31_TEST_DB_NAME"] = os.environ.get("E31_BENCH_DB_NAME", "bench_e31_ledger")

import django

django.setup()

from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402

from accounts.models import Team  # noqa: E402
from jobs.models import Allocation, Job, Node  # noqa: E402
from metering import reports, services  # noqa: E402
from metering.periods import hour_slices, micros  # noqa: E402

YEAR = 2025
TEAMS = 50
NODES = 40
COLUMNS = (
    "allocation_id", "job_id", "team_id", "period_start", "period_end", "gpus", "microseconds",
    "kind", "reason", "created_at",
)  # fmt: skip


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def plan(rows: int, rng: random.Random) -> list[tuple[int, datetime, datetime, int]]:
    """(team index, RENT, RELEASE, gpus) for allocations whose hourly rows add up to ``rows``."""
    start, end = datetime(YEAR, 1, 1, tzinfo=UTC), datetime(YEAR + 1, 1, 1, tzinfo=UTC)
    span_us = micros(end - start)
    spans, total = [], 0
    while total < rows:
        rented = start + timedelta(microseconds=rng.randrange(span_us - 50 * 3_600_000_000))
        released = rented + timedelta(microseconds=rng.randrange(3_600_000_000 // 10, 48 * 3_600_000_000))
        count = len(list(hour_slices(rented, released)))
        if total + count > rows:
            released = _trim(rented, rows - total)
            count = rows - total
        spans.append((len(spans) % TEAMS, rented, released, rng.choice((1, 2, 4, 8))))
        total += count
    return spans


def _trim(rented: datetime, count: int) -> datetime:
    """A RELEASE that gives exactly ``count`` hourly rows."""
    boundary = rented.replace(minute=0, second=0, microsecond=0) + timedelta(hours=count - 1)
    return boundary + timedelta(minutes=17) if count > 1 else rented + timedelta(microseconds=1)


def create_pool(spans) -> list[Allocation]:
    teams = Team.objects.bulk_create(Team(name=f"team-{i:02d}", slug=f"team-{i:02d}") for i in range(TEAMS))
    now = datetime(YEAR, 1, 1, tzinfo=UTC)
    nodes = Node.objects.bulk_create(
        Node(name=f"gpu-{i:03d}", gpus=8, registered_at=now, state_changed_at=now) for i in range(NODES)
    )
    jobs = Job.objects.bulk_create(
        (
            Job(
                team=teams[t], name=f"job-{n}", state="released", end_reason="succeeded", submitted_at=rented,
                state_changed_at=released, argv=["train"], gpus=gpus, hours=48.0, attempt=1,
                output_uri="file:///tmp/out", output_bytes=0,
            )
            for n, (t, rented, released, gpus) in enumerate(spans)
        ),
        batch_size=5000,
    )  # fmt: skip
    return Allocation.objects.bulk_create(
        (
            Allocation(
                job=job, attempt=1, node=nodes[n % NODES], gpu_indices=list(range(gpus)), rented_at=rented,
                released_at=released, end_reason="succeeded",
            )
            for n, (job, (_, rented, released, gpus)) in enumerate(zip(jobs, spans, strict=True))
        ),
        batch_size=5000,
    )  # fmt: skip


def copy_rows(allocations: list[Allocation]) -> int:
    """COPY every allocation's hourly rows, the last one final, exactly as close_meter writes them."""
    written = 0
    sql = f"COPY metering_meterentry ({', '.join(COLUMNS)}) FROM STDIN"
    with connection.cursor() as cursor, cursor.cursor.copy(sql) as copy:
        for a in allocations:
            for start, end in hour_slices(a.rented_at, a.released_at):
                kind = "final" if end == a.released_at else "accrual"
                copy.write_row(
                    (
                        a.id,
                        a.job_id,
                        a.job.team_id,
                        start,
                        end,
                        a.gpu_count,
                        micros(end - start),
                        kind,
                        "",
                        end,
                    )
                )
                written += 1
    return written


def p95_ms(samples: list[float]) -> float:
    return round(statistics.quantiles(samples, n=20)[18] * 1000, 2)


def timed(call, pairs) -> list[float]:
    samples = []
    for team, month in pairs:
        began = time.perf_counter()
        call(team=team, month=month)
        samples.append(time.perf_counter() - began)
    return samples


def export_rate() -> tuple[int, float]:
    """A full-year CSV of every team, streamed through the real view as an operator would fetch it."""
    from django.contrib.auth import get_user_model

    operator = get_user_model().objects.create_user("bench-operator", is_staff=True)
    client = Client()
    client.force_login(operator)
    began = time.perf_counter()
    response = client.get("/ledger/export.csv", {"start": f"{YEAR}-01-01", "end": f"{YEAR}-12-31"})
    lines = sum(chunk.count(b"\n") for chunk in response.streaming_content) - 1  # minus the header
    return lines, time.perf_counter() - began


def measure(samples: int, rng: random.Random) -> dict:
    teams = list(Team.objects.all())
    months = [datetime(YEAR, m, 1, tzinfo=UTC) for m in range(1, 13)]
    pairs = [(rng.choice(teams), rng.choice(months)) for _ in range(samples)]
    timed(reports.statement, pairs[:5])
    timed(reports.by_day, pairs[:5])  # warm the caches once, as a running server would be
    statement = timed(reports.statement, pairs)
    chart = timed(reports.by_day, pairs)
    csv_rows, csv_s = export_rate()
    return {
        "statement_p95_ms": p95_ms(statement),
        "chart_p95_ms": p95_ms(chart),
        "csv_rows_per_s": round(csv_rows / csv_s),
        "statement_p50_ms": round(statistics.median(statement) * 1000, 2),
        "chart_p50_ms": round(statistics.median(chart) * 1000, 2),
        "csv_rows": csv_rows,
        "csv_s": round(csv_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--keep", action="store_true", help="keep the bench database afterwards")
    parser.add_argument("--check", action="store_true", help="also run find_violations over the loaded rows")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    old = setup_databases(verbosity=0, interactive=False, keepdb=False)
    try:
        began = time.perf_counter()
        allocations = create_pool(plan(args.rows, rng))
        rows = copy_rows(allocations)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE metering_meterentry")
        load_s = time.perf_counter() - began
        log(f"loaded {rows} rows for {len(allocations)} allocations in {load_s:.1f} s")
        result = {
            "rows": rows,
            **measure(args.samples, rng),
            "load_s": round(load_s, 1),
            "db": connection.vendor,
        }
        if args.check:
            result["violations"] = len(services.find_violations())
    finally:
        if not args.keep:
            teardown_databases(old, verbosity=0)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
