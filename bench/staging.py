"""Staging throughput against the machine's own floor, and the bytes a cache hit moves.

    DATABASE_URL=postgres://e31:e31@127.0.0.1:5432/e31 .venv/bin/python bench/staging.py [--size-mb 2000]
        [--rounds 5] [--record]

Stages one file (random bytes, default 2,000 MB) through ``jobs.staging.stage_job`` from a
``file://`` source and from a local HTTP server on 127.0.0.1 (the tests' server, in its own
process: threaded http.server, sendfile, Range), each once without a declared sha256 and once with one, every run a
cache miss. In the same rounds, alternating with them, it measures the machine's floor on the same
bytes: ``cp`` of the file, ``curl`` of the URL, and sha256 of the file with hashlib. Figures are
medians over the rounds. ``sha_ratio`` sets each checksummed run against min(its floor command,
sha256); ``sha_ratio_own`` against min(the stager's own unhashed run, sha256), the stricter ceiling
where the stager beats ``curl``. Then a second job on the same dataset shows what a cache hit moves.

Runs against a throwaway database (``bench_e31_staging``, or $E31_BENCH_DB_NAME) and a folder in
/tmp, both removed afterwards. ``--record`` then stores the figures in DATABASE_URL's own database
(``staging.throughput`` and ``staging.cache``) for the public unsolved-problems page. The last
line printed is JSON.
"""

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "e31web.settings")
# Never the test suite's database: the bench creates and drops its own.
os.environ["E31_TEST_DB_NAME"] = os.environ.get("E31_BENCH_DB_NAME", "bench_e31_staging")

import django

django.setup()

from django.test.utils import override_settings, setup_databases, teardown_databases  # noqa: E402
from django.utils import timezone  # noqa: E402

from accounts.models import Team  # noqa: E402
from jobs import dispatch, staging  # noqa: E402
from jobs.models import DataInput, DatasetCacheEntry, Job  # noqa: E402
from public import services as site  # noqa: E402

MB = 10**6
COMMAND = "python bench/staging.py"
SETTLE_S = 3.0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def make_source(path: Path, size: int) -> str:
    """Random bytes (nothing compresses or dedups them), and their sha256 for the declared runs."""
    digest = hashlib.sha256()
    block = 64 * 1024 * 1024
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        for offset in range(0, size, block):
            chunk = os.urandom(min(block, size - offset))
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def settle() -> None:
    """Each run starts with nothing left from the last: no dirty pages, and (on a filesystem mounted
    with online discard, as /tmp is here) the last run's deleted gigabytes trimmed, which otherwise
    stalls whichever run comes next."""
    os.sync()
    time.sleep(SETTLE_S)


def timed(fn) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


class Bench:
    def __init__(self, work: Path, source: Path, size: int, sha: str, port: int) -> None:
        self.work, self.source, self.size, self.sha, self.port = work, source, size, sha, port
        self.team = Team.objects.create(name="bench", slug="bench")
        self.count = 0

    def stage(self, uri: str, *, with_sha: bool) -> tuple[float, DataInput]:
        """Seconds for stage_job to put one input in place (SUBMITTED to QUEUED), and its row."""
        self.count += 1
        now = timezone.now()
        job = Job.objects.create(team=self.team, name=f"bench-{self.count}", state="submitted", submitted_at=now,
                                 state_changed_at=now, argv=["true"], gpus=1, hours=1.0,
                                 output_uri="file:///tmp/out", output_bytes=0)  # fmt: skip
        DataInput.objects.create(job=job, position=0, name="data", uri=uri, bytes=self.size,
                                 sha256=self.sha if with_sha else "")  # fmt: skip
        seconds = timed(lambda: staging.stage_job(job_id=job.id, now=timezone.now()))
        job.refresh_from_db()
        if job.state != "queued":
            raise SystemExit(f"staging failed: {job.end_detail}")
        Job.objects.filter(id=job.id).update(state="ended", end_reason="cancelled")  # unpins its entry
        return seconds, job.inputs.get()

    def forget(self) -> None:
        """Every measured run is a cache miss: drop the cache and the staged copies."""
        DatasetCacheEntry.objects.all().delete()
        shutil.rmtree(staging.cache_dir(), ignore_errors=True)
        for path in staging.job_dir(0).parent.iterdir():
            if path.name.isdigit():
                shutil.rmtree(path, ignore_errors=True)

    def run(self, name: str) -> float:
        """One measurement, in MB/s."""
        target = self.work / "staging" / "floor.out"
        commands = {
            "cp": lambda: subprocess.run(["cp", str(self.source), str(target)], check=True),
            "curl": lambda: subprocess.run(["curl", "-sf", "-o", str(target), self.url], check=True),
            "sha256": lambda: hashlib_sha256(self.source),
        }
        settle()
        if name in commands:
            seconds = timed(commands[name])
            target.unlink(missing_ok=True)
        else:
            uri = self.url if name.startswith("http") else f"file://{self.source}"
            seconds, _ = self.stage(uri, with_sha=name.endswith("_sha"))
            self.forget()
        return self.size / MB / seconds

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self.source.name}"

    def bytes_sent(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/_stats") as stats:
            return json.load(stats)["bytes_sent"]

    def cache_hit(self) -> dict:
        """A second job on the same dataset: what the server sent and what the stager says."""
        moved = {}
        for label, uri in (("http", self.url), ("file", f"file://{self.source}")):
            self.stage(uri, with_sha=True)
            sent = self.bytes_sent()
            seconds, data = self.stage(uri, with_sha=True)
            moved[label] = (self.bytes_sent() - sent) + (0 if data.stage_state == "cached" else data.bytes)
            moved[f"{label}_hit_s"] = round(seconds, 3)
            self.forget()
        return moved


def serve(root: Path) -> subprocess.Popen:
    """The tests' HTTP server in a process of its own, so it shares no GIL with the stager (or curl)."""
    repo = Path(__file__).resolve().parent.parent
    return subprocess.Popen([sys.executable, "-m", "tests.staging.httpserver", str(root)], cwd=repo,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip


def hashlib_sha256(path: Path) -> None:
    digest = hashlib.sha256()
    buf = memoryview(bytearray(4 * 1024 * 1024))
    with path.open("rb", buffering=0) as handle:
        while n := handle.readinto(buf):
            digest.update(buf[:n])


def measure(bench: Bench, rounds: int) -> dict[str, list[float]]:
    names = ["cp", "file", "file_sha", "sha256", "curl", "http", "http_sha"]
    figures: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        order = order[::-1] if r % 2 else order  # alternate who runs first, and who runs after whom
        for name in order:
            figures[name].append(bench.run(name))
            log(f"round {r + 1}: {name} {figures[name][-1]:.0f} MB/s")
    return figures


def summarise(figures: dict[str, list[float]], moved: dict, size: int, rounds: int) -> dict:
    med = {name: round(statistics.median(values), 1) for name, values in figures.items()}

    def sha_ratio(file_ceiling: str, http_ceiling: str) -> float:
        """The checksummed runs against min(a ceiling, sha256), the worse of the two sources."""
        return round(min(med["file_sha"] / min(med[file_ceiling], med["sha256"]),
                         med["http_sha"] / min(med[http_ceiling], med["sha256"])), 3)  # fmt: skip

    return {
        "file_mb_s": med["file"], "http_mb_s": med["http"],
        "file_sha_mb_s": med["file_sha"], "http_sha_mb_s": med["http_sha"],
        "cp_mb_s": med["cp"], "curl_mb_s": med["curl"], "sha256_mb_s": med["sha256"],
        "file_ratio": round(med["file"] / med["cp"], 3),
        "http_ratio": round(med["http"] / med["curl"], 3),
        "sha_ratio": sha_ratio("cp", "curl"),
        # The stager's own unhashed copies as the ceiling: a slow `curl` cannot flatter it.
        "sha_ratio_own": sha_ratio("file", "http"),
        "cached_bytes_moved": moved["http"] + moved["file"],
        "cached_hit_s": max(moved["http_hit_s"], moved["file_hit_s"]),
        "size_mb": size // MB, "rounds": rounds, "cpus": os.cpu_count(),
    }  # fmt: skip


def record(result: dict) -> None:
    now = timezone.now()
    throughput = {k: v for k, v in result.items() if k not in ("cached_bytes_moved", "cached_hit_s")}
    site.record_measurement(key="staging.throughput", title="Staging throughput vs the machine's floor",
                            figures=throughput, command=COMMAND, now=now)  # fmt: skip
    site.record_measurement(key="staging.cache", title="Bytes a cache hit moves",
                            figures={"cached_bytes_moved": result["cached_bytes_moved"],
                                     "cached_hit_s": result["cached_hit_s"], "size_mb": result["size_mb"]},
                            command=COMMAND, now=now)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--record", action="store_true", help="store the figures in DATABASE_URL's database")
    args = parser.parse_args()
    size = args.size_mb * MB
    work = Path(tempfile.mkdtemp(prefix="e31-bench-staging-", dir="/tmp")).resolve()
    (work / "data").mkdir()
    (work / "staging").mkdir()
    # No broker in the bench: the scheduler's doorbell (rung once a job is queued) is not part of staging.
    dispatch.request_scheduler_pass = lambda: None
    old = setup_databases(verbosity=0, interactive=False, keepdb=False)
    server = None
    try:
        source = work / "data" / "bench" / "dataset.bin"  # the bench team's folder of the data root
        log(f"writing {args.size_mb} MB of random bytes to {source}")
        sha = make_source(source, size)
        server = serve(source.parent)
        with override_settings(E31_DATA_ROOTS=[work / "data"], E31_STAGING_ROOT=work / "staging",
                               E31_ALLOW_PRIVATE_SOURCES=True, E31_STAGE_CACHE_BYTES=4 * size):  # fmt: skip
            bench = Bench(work, source, size, sha, int(server.stdout.readline()))
            figures = measure(bench, args.rounds)
            moved = bench.cache_hit()
        result = summarise(figures, moved, size, args.rounds)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        teardown_databases(old, verbosity=0)
        shutil.rmtree(work, ignore_errors=True)
    if args.record:
        record(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
