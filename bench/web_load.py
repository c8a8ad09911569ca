"""The console under load: gunicorn (2 workers) on PostgreSQL with 100,000 jobs and 1,000,000 ledger rows.

    DATABASE_URL=postgres://e31:e31@127.0.0.1:5432/e31 .venv/bin/python bench/web_load.py [--keep]

Creates a throwaway database (``e31_load``, or $E31_BENCH_DB_NAME) with the test runner's machinery,
so the schema and indexes are the migrations'; bulk-loads 20 teams, 100,000 jobs (2,000 waiting,
the rest released, each with its events) and 1,000,000 hourly ledger rows over the last 90 days;
starts gunicorn on 127.0.0.1 and measures, as a member of one team (5,000 jobs, 50,000 rows), the
job list, a job page, the team ledger and the queue, beside /healthz (no database) as the floor:

(a) a busy day: 50 clients, each pausing 1 s between requests (about 50 requests/s offered) for
    60 s, cycling through the five pages: p50/p95/p99 and errors per page;
(b) saturation: per page, 50 clients with no pause for 15 s (the first 3 s discarded):
    requests/s, and its ratio to the floor's.

Goals: (a) p95 under 150 ms on every page with 0 errors; (b) no page below a tenth of the floor.
The load generator (asyncio + aiohttp, one process) shares the machine with gunicorn and
PostgreSQL, so on a small machine saturation figures are a floor, not a ceiling.
The last line printed is JSON. Not part of the test suite: run it on demand.
"""

import argparse
import asyncio
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "e31web.settings")
os.environ.setdefault(
    "SECRET_KEY", "web-load-bench-" + "x" * 40
)  # shared with gunicorn: sessions must verify
# Never the test suite's database: the bench creates and drops its own.
os.environ["E31_TEST_DB_NAME"] = os.environ.get("E31_BENCH_DB_NAME", "e31_load")

import aiohttp  # noqa: E402
import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402

from accounts.models import Membership, Team  # noqa: E402
from jobs.models import Allocation, Job, Node  # noqa: E402
from metering.periods import hour_slices, micros  # noqa: E402

JOBS, ROWS, TEAMS, NODES, WAITING = 100_000, 1_000_000, 20, 40, 2_000
CLIENTS, BUSY_S, SATURATE_S, WARMUP_S = 50, 60, 15, 3
NOW = datetime.now(UTC).replace(microsecond=0)
EVENTS = ("submitted", "staging", "queued", "rented", "running", "output", "released")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- data


def _spans(rng: random.Random, count: int) -> list[tuple[datetime, datetime]]:
    """(RENT, RELEASE) per released job over the last 90 days, whose hourly rows add up to ROWS."""
    per_job, spans, total = ROWS // count, [], 0
    for i in range(count):
        rented = NOW - timedelta(days=90) + timedelta(seconds=rng.randrange(89 * 86400))
        want = per_job if i < count - 1 else ROWS - total
        boundary = rented.replace(minute=0, second=0) + timedelta(hours=want - 1)
        released = (
            boundary + timedelta(minutes=rng.randrange(1, 59)) if want > 1 else rented + timedelta(seconds=1)
        )
        spans.append((rented, released))
        total += len(list(hour_slices(rented, released)))
    return spans


def _jobs(teams: list[Team], spans, rng: random.Random) -> list[Job]:
    released = [
        Job(team=teams[i % TEAMS], name=f"train-{i}", state="released", end_reason="succeeded", exit_code=0,
            submitted_at=rented - timedelta(minutes=2), state_changed_at=done, argv=["python", "train.py"],
            gpus=rng.choice((1, 2, 4, 8)), hours=12.0, attempt=1, output_uri="file:///tmp/out", output_bytes=0)
        for i, (rented, done) in enumerate(spans)
    ]  # fmt: skip
    waiting = [
        Job(team=teams[i % TEAMS], name=f"wait-{i}", state="queued", submitted_at=NOW - timedelta(minutes=i),
            state_changed_at=NOW, argv=["python", "train.py"], gpus=8, hours=4.0, output_uri="file:///tmp/out",
            output_bytes=0, pending_reason="needs 8 GPUs on one node", priority=float(WAITING - i),
            estimated_start=NOW + timedelta(minutes=10 + i))
        for i in range(WAITING)
    ]  # fmt: skip
    return Job.objects.bulk_create(released + waiting, batch_size=5000)


def _copy(table: str, columns: tuple[str, ...], rows) -> int:
    written = 0
    with (
        connection.cursor() as cursor,
        cursor.cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as cp,
    ):
        for row in rows:
            cp.write_row(row)
            written += 1
    return written


def _events(jobs: list[Job], spans) -> int:
    def rows():
        for job, (rented, done) in zip(jobs, spans, strict=False):
            times = (job.submitted_at, job.submitted_at, rented, rented, rented, done, done)
            for prev, (state, at) in zip(("", *EVENTS), zip(EVENTS, times, strict=True), strict=False):
                yield job.id, prev, state, at, state, "bench", 1
        for job in jobs[len(spans) :]:
            for prev, state in zip(("", "submitted", "staging"), EVENTS[:3], strict=True):
                yield job.id, prev, state, job.submitted_at, state, "bench", 0

    return _copy(
        "jobs_jobevent", ("job_id", "from_state", "to_state", "at", "reason", "actor", "attempt"), rows()
    )


def _ledger(allocations: list[Allocation]) -> int:
    def rows():
        for a in allocations:
            for start, end in hour_slices(a.rented_at, a.released_at):
                kind = "final" if end == a.released_at else "accrual"
                yield (
                    a.id,
                    a.job_id,
                    a.team_id,
                    start,
                    end,
                    len(a.gpu_indices),
                    micros(end - start),
                    kind,
                    "",
                    end,
                )

    columns = ("allocation_id", "job_id", "team_id", "period_start", "period_end", "gpus", "microseconds",
               "kind", "reason", "created_at")  # fmt: skip
    return _copy("metering_meterentry", columns, rows())


def load(rng: random.Random) -> tuple[str, list[int]]:
    """Loads the data; returns a member's session key and some of the member's job ids."""
    teams = Team.objects.bulk_create(Team(name=f"team-{i:02d}", slug=f"team-{i:02d}") for i in range(TEAMS))
    nodes = Node.objects.bulk_create(
        Node(name=f"gpu-{i:03d}", gpus=8, registered_at=NOW, state_changed_at=NOW, last_heartbeat=NOW)
        for i in range(NODES)
    )
    spans = _spans(rng, JOBS - WAITING)
    jobs = _jobs(teams, spans, rng)
    allocations = Allocation.objects.bulk_create(
        (Allocation(job=job, attempt=1, node=nodes[n % NODES], gpu_indices=list(range(job.gpus)), rented_at=r,
                    started_at=r, finished_at=d, sealed_at=d, released_at=d, end_reason="succeeded", exit_code=0)
         for n, (job, (r, d)) in enumerate(zip(jobs, spans, strict=False))),
        batch_size=5000,
    )  # fmt: skip
    for a, job in zip(allocations, jobs, strict=False):
        a.team_id = job.team_id
    log(f"loaded {len(jobs)} jobs, {_events(jobs, spans)} events, {_ledger(allocations)} ledger rows")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    member = get_user_model().objects.create_user("bench-member", password=None)
    Membership.objects.create(team=teams[0], user=member, role="member")
    client = Client()
    client.force_login(member)
    mine = [j.id for j in jobs[: JOBS - WAITING : TEAMS]][:200]
    return client.cookies["sessionid"].value, mine


# --------------------------------------------------------------------------- server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gunicorn(port: int) -> subprocess.Popen:
    db = connection.settings_dict
    env = {
        **os.environ, "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "E31_ALLOWED_HOSTS": "127.0.0.1", "E31_DEBUG": "0", "E31_LOG_LEVEL": "WARNING",
    }  # fmt: skip
    env.pop("E31_TEST_DB_NAME")
    cmd = [str(ROOT / ".venv/bin/gunicorn"), "e31web.wsgi:application", "--workers", "2", "--bind",
           f"127.0.0.1:{port}", "--log-level", "warning", "--timeout", "60"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("gunicorn did not start")


# --------------------------------------------------------------------------- load


class Recorder:
    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)

    def add(self, page: str, seconds: float, ok: bool) -> None:
        self.latency[page].append(seconds)
        self.errors[page] += not ok


async def fetch(session: aiohttp.ClientSession, base: str, page: str, path: str, rec: Recorder) -> None:
    began = time.perf_counter()
    try:
        async with session.get(base + path, allow_redirects=False) as response:
            await response.read()
            ok = response.status == 200
    except (TimeoutError, aiohttp.ClientError):
        ok = False
    rec.add(page, time.perf_counter() - began, ok)


async def run_clients(base: str, cookie: str, paths, *, seconds: float, pause: float, rec: Recorder) -> None:
    """CLIENTS concurrent clients, each cycling through ``paths`` (name -> path factory) until the deadline."""
    deadline = time.monotonic() + seconds
    names = list(paths)
    timeout = aiohttp.ClientTimeout(total=30)
    connector = aiohttp.TCPConnector(limit=CLIENTS)
    async with aiohttp.ClientSession(headers={"Cookie": f"sessionid={cookie}"}, timeout=timeout,
                                     connector=connector) as session:  # fmt: skip

        async def client(k: int) -> None:
            await asyncio.sleep(pause * k / CLIENTS)  # spread the starts over one pause
            i = k
            while time.monotonic() < deadline:
                name = names[i % len(names)]
                await fetch(session, base, name, paths[name](), rec)
                i += 1
                if pause:
                    await asyncio.sleep(pause)

        await asyncio.gather(*(client(k) for k in range(CLIENTS)))


def pct(samples: list[float], q: int) -> float:
    return round(statistics.quantiles(samples, n=100)[q - 1] * 1000, 1) if len(samples) > 1 else 0.0


def busy_day(base: str, cookie: str, paths) -> dict[str, dict]:
    rec = Recorder()
    asyncio.run(run_clients(base, cookie, paths, seconds=BUSY_S, pause=1.0, rec=rec))
    return {
        name: {"p50_ms": pct(s, 50), "p95_ms": pct(s, 95), "p99_ms": pct(s, 99), "errors": rec.errors[name],
               "requests": len(s)}
        for name, s in rec.latency.items()
    }  # fmt: skip


def saturation(base: str, cookie: str, name: str, path) -> float:
    """Requests/s answered 200 by the server for one page under CLIENTS clients with no pause."""
    asyncio.run(run_clients(base, cookie, {name: path}, seconds=WARMUP_S, pause=0.0, rec=Recorder()))
    rec = Recorder()
    asyncio.run(run_clients(base, cookie, {name: path}, seconds=SATURATE_S - WARMUP_S, pause=0.0, rec=rec))
    ok = len(rec.latency[name]) - rec.errors[name]
    return round(ok / (SATURATE_S - WARMUP_S), 1)


def measure(port: int, cookie: str, mine: list[int], rng: random.Random) -> dict:
    base = f"http://127.0.0.1:{port}"
    paths = {
        "job_list": lambda: "/jobs/",
        "job_page": lambda: f"/jobs/{rng.choice(mine)}/",
        "team_ledger": lambda: "/ledger/",
        "queue": lambda: "/jobs/queue/",
        "floor": lambda: "/healthz",
    }
    for name, path in paths.items():  # every page answers 200 (not a sign-in redirect) before any load
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", path(), headers={"Cookie": f"sessionid={cookie}"})
        status = conn.getresponse().status
        conn.close()
        if status != 200:
            raise RuntimeError(f"{name} answered {status} before any load")
    busy = busy_day(base, cookie, paths)
    log(f"busy day: {json.dumps(busy)}")
    rps = {name: saturation(base, cookie, name, path) for name, path in paths.items()}
    log(f"saturation: {json.dumps(rps)}")
    floor = {**busy.pop("floor"), "max_rps": rps["floor"]}
    pages = {
        name: {**figures, "max_rps": rps[name], "floor_ratio": round(rps[name] / rps["floor"], 3)}
        for name, figures in busy.items()
    }
    return {"pages": pages, "floor": floor}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--keep", action="store_true", help="keep the bench database afterwards")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    old = setup_databases(verbosity=0, interactive=False, keepdb=False)
    server = None
    try:
        began = time.perf_counter()
        cookie, mine = load(rng)
        log(f"data ready in {time.perf_counter() - began:.0f} s")
        port = free_port()
        server = start_gunicorn(port)
        result = measure(port, cookie, mine, rng)
        result["data"] = {"jobs": JOBS, "ledger_rows": ROWS, "teams": TEAMS, "member_jobs": JOBS // TEAMS}
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        connection.close()
        if not args.keep:
            teardown_databases(old, verbosity=0)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
