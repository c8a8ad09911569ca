"""The console's pages against the floor: gunicorn (2 workers) on PostgreSQL, 100,000 jobs, 1,000,000 ledger rows.

    DATABASE_URL=postgres://e31:e31@127.0.0.1:5432/e31 .venv/bin/python bench/web_load.py [--keep|--reuse]

Creates a throwaway database (``e31_load``, or $E31_BENCH_DB_NAME) with the test runner's machinery,
so the schema and indexes are the migrations'; bulk-loads 20 teams, 100,000 jobs (2,000 waiting,
the rest released, each with its events) and 1,000,000 hourly ledger rows over the last 90 days;
starts gunicorn on 127.0.0.1 and measures, as a member of one team (5,000 jobs, 50,000 rows), the
job list, a job page, the team ledger, the queue and the API job list, and as an operator the
pool, beside /healthz (no database) as the floor. One more page is measured as a reference, not a
goal: the member's e-mail settings (``layout``), which renders the layout around a short form and
reads no job or ledger row. What it reaches is what any signed-in page can reach before it reads
its own data (the session, the user, the team label, the menu):

(a) saturation: per page, 50 clients with no pause for 12 s (after 2 s of warm-up): requests/s
    answered 200, and its ratio to the floor's in the same run (``floor_ratio``);
(b) latency at one fixed offered rate, a tenth of the floor's saturation rate, open loop
    (Poisson arrivals, each sent at its time whatever is in flight; latency counted from that
    time) for 15 s per page: p95 per page, and its ratio to the floor's own p95 at the same rate
    (``p95_ratio``; the floor runs before and after the pages, pooled).

Goals: every page at least 0.25 of the floor at saturation; every page's p95 within 3x the
floor's at the fixed rate. The load generator (asyncio + aiohttp, one process) shares the machine
with gunicorn and PostgreSQL. ``--keep`` keeps the database; ``--reuse`` runs again on a kept one.
The last line printed is JSON: ``pages.{name}.{floor_ratio, p95_ms, p95_ratio, …}``,
``floor.{max_rps, p95_ms}``, ``reference.layout.{floor_ratio, p95_ms, p95_ratio}``, ``rate_rps``. Not part of the test suite: run it on demand.
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
from collections.abc import Callable
from dataclasses import dataclass
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

from accounts import services as accounts  # noqa: E402
from accounts.models import Membership, Team  # noqa: E402
from common import schema  # noqa: E402
from jobs.models import Allocation, Job, Node  # noqa: E402
from metering.models import MeterEntry  # noqa: E402
from metering.periods import hour_slices, micros  # noqa: E402

JOBS, ROWS, TEAMS, NODES, WAITING = 100_000, 1_000_000, 20, 40, 2_000
CLIENTS, SATURATE_S, FIXED_RATE_S, WARMUP_S = 50, 12, 15, 2
REFERENCES = ("layout",)  # measured beside the pages, no goal of their own
FIXED_RATE_SHARE = 0.1  # the fixed rate: a tenth of what the floor sustains, so no page queues
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


def load(rng: random.Random) -> None:
    """Loads the data, a member of team-00 and an operator."""
    teams = Team.objects.bulk_create(Team(name=f"team-{i:02d}", slug=f"team-{i:02d}") for i in range(TEAMS))
    nodes = Node.objects.bulk_create(
        Node(name=f"gpu-{i:03d}", gpus=8, registered_at=NOW, state_changed_at=NOW, last_heartbeat=NOW,
             agent_version=schema.code().version)  # a pool on the console's code: no OTHER CODE on the page
        for i in range(NODES)
    )  # fmt: skip
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
    member = get_user_model().objects.create_user("bench-member", password=None)
    Membership.objects.create(team=teams[0], user=member, role="member")
    get_user_model().objects.create_user("bench-operator", password=None, is_staff=True)


def sign_in() -> tuple[dict[str, str], str, list[int]]:
    """Sessions of the member and the operator, the member's API token, and some of the member's jobs."""
    users = get_user_model().objects
    cookies = {}
    for role, username in (("member", "bench-member"), ("operator", "bench-operator")):
        client = Client()
        client.force_login(users.get(username=username))
        cookies[role] = client.cookies["sessionid"].value
    _, token = accounts.create_api_token(user=users.get(username="bench-member"), label="bench")
    team = Team.objects.get(slug="team-00")
    mine = list(Job.objects.filter(team=team, state="released").values_list("id", flat=True)[:200])
    return cookies, token, mine


def counted() -> dict[str, int]:
    """What the measured database holds, counted there: a --reuse run measures whatever the kept one has."""
    return {
        "jobs": Job.objects.count(),
        "ledger_rows": MeterEntry.objects.count(),
        "teams": Team.objects.count(),
        "member_jobs": Job.objects.filter(team__memberships__user__username="bench-member").count(),
    }


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
        # One token drives the API page at saturation: the throttle's count is still paid, its refusals are not.
        "E31_API_RATE": "100000000/s",
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


@dataclass(frozen=True)
class Page:
    path: Callable[[], str]
    headers: dict[str, str]


class Recorder:
    def __init__(self) -> None:
        self.latency: list[float] = []
        self.errors = 0

    def add(self, seconds: float, ok: bool) -> None:
        self.latency.append(seconds)
        self.errors += not ok


async def fetch(session: aiohttp.ClientSession, base: str, page: Page, rec: Recorder, since: float) -> None:
    """One request; its latency counts from ``since`` (the arrival it was meant for, in open loop)."""
    try:
        async with session.get(base + page.path(), headers=page.headers, allow_redirects=False) as response:
            await response.read()
            ok = response.status == 200
    except (TimeoutError, aiohttp.ClientError):
        ok = False
    rec.add(time.perf_counter() - since, ok)


def session(limit: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=limit)
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), connector=connector)


async def closed_loop(base: str, page: Page, *, seconds: float, rec: Recorder) -> None:
    """CLIENTS clients, each sending its next request as soon as the last is answered."""
    deadline = time.monotonic() + seconds
    async with session(CLIENTS) as client_session:

        async def client() -> None:
            while time.monotonic() < deadline:
                await fetch(client_session, base, page, rec, time.perf_counter())

        await asyncio.gather(*(client() for _ in range(CLIENTS)))


async def open_loop(base: str, page: Page, *, rate: float, seconds: float, rng: random.Random,
                    rec: Recorder) -> None:  # fmt: skip
    """Poisson arrivals at ``rate`` per second, each sent at its time whatever is still in flight."""
    async with session(0) as client_session:
        start, at, inflight = time.perf_counter(), 0.0, []
        while (at := at + rng.expovariate(rate)) < seconds:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            inflight.append(asyncio.create_task(fetch(client_session, base, page, rec, start + at)))
        await asyncio.gather(*inflight)


def pct(samples: list[float], q: int) -> float:
    return round(statistics.quantiles(samples, n=100)[q - 1] * 1000, 1) if len(samples) > 1 else 0.0


def saturation(base: str, page: Page) -> float:
    """Requests/s answered 200 for one page under CLIENTS clients with no pause."""
    asyncio.run(closed_loop(base, page, seconds=WARMUP_S, rec=Recorder()))
    rec = Recorder()
    asyncio.run(closed_loop(base, page, seconds=SATURATE_S, rec=rec))
    return round((len(rec.latency) - rec.errors) / SATURATE_S, 1)


def at_rate(base: str, page: Page, rate: float, rng: random.Random) -> Recorder:
    asyncio.run(open_loop(base, page, rate=rate, seconds=WARMUP_S, rng=rng, rec=Recorder()))
    rec = Recorder()
    asyncio.run(open_loop(base, page, rate=rate, seconds=FIXED_RATE_S, rng=rng, rec=rec))
    return rec


def pages(cookies: dict[str, str], token: str, mine: list[int], rng: random.Random) -> dict[str, Page]:
    member = {"Cookie": f"sessionid={cookies['member']}"}
    return {
        "floor": Page(lambda: "/healthz", {}),
        "layout": Page(lambda: "/notifications/", member),
        "job_list": Page(lambda: "/jobs/", member),
        "job_page": Page(lambda: f"/jobs/{rng.choice(mine)}/", member),
        "team_ledger": Page(lambda: "/ledger/", member),
        "queue": Page(lambda: "/jobs/queue/", member),
        "operator_pool": Page(lambda: "/operator/pool/", {"Cookie": f"sessionid={cookies['operator']}"}),
        "api_job_list": Page(lambda: "/api/v1/jobs", {"Authorization": f"Bearer {token}"}),
    }


def check_answers(port: int, named: dict[str, Page]) -> None:
    """Every page answers 200 (not a sign-in redirect) before any load."""
    for name, page in named.items():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", page.path(), headers=page.headers)
        status = conn.getresponse().status
        conn.close()
        if status != 200:
            raise RuntimeError(f"{name} answered {status} before any load")


def measure(port: int, named: dict[str, Page], rng: random.Random) -> dict:
    base = f"http://127.0.0.1:{port}"
    check_answers(port, named)
    rps = {name: saturation(base, page) for name, page in named.items()}
    log(f"saturation (req/s): {json.dumps(rps)}")
    rate = round(FIXED_RATE_SHARE * rps["floor"], 1)
    recorded = {name: at_rate(base, page, rate, rng) for name, page in named.items()}
    # The floor again after the pages, so that drift in the machine's load shows in both.
    recorded["floor"].latency += at_rate(base, named["floor"], rate, rng).latency
    p95 = {name: pct(rec.latency, 95) for name, rec in recorded.items()}
    log(f"p95 at {rate} req/s (ms): {json.dumps(p95)}")
    measured = {
        name: {
            "floor_ratio": round(rps[name] / rps["floor"], 3), "p95_ms": p95[name],
            "p95_ratio": round(p95[name] / p95["floor"], 2), "max_rps": rps[name],
            "p50_ms": pct(recorded[name].latency, 50), "errors": recorded[name].errors,
        }
        for name in named if name != "floor"
    }  # fmt: skip
    reference = {name: measured.pop(name) for name in REFERENCES}
    return {
        "pages": measured,
        "floor": {"max_rps": rps["floor"], "p95_ms": p95["floor"]},
        "reference": reference,
        "rate_rps": rate,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--keep", action="store_true", help="keep the bench database afterwards")
    parser.add_argument("--reuse", action="store_true", help="use a database kept by --keep as it is")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    # serialized_aliases=(): a kept database of 1,000,000 rows is not serialised for test rollbacks.
    old = setup_databases(verbosity=0, interactive=False, keepdb=args.reuse, serialized_aliases=())
    server = None
    try:
        began = time.perf_counter()
        if not (args.reuse and Job.objects.exists()):
            load(rng)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")
        log(f"data ready in {time.perf_counter() - began:.0f} s")
        cookies, token, mine = sign_in()
        port = free_port()
        server = start_gunicorn(port)
        result = measure(port, pages(cookies, token, mine, rng), rng)
        result["data"] = counted()
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        connection.close()
        if not (args.keep or args.reuse):
            teardown_databases(old, verbosity=0)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
