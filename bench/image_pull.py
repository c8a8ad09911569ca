"""Image staging against the same tools run by hand, and the bytes a second job's pull moves.

    DATABASE_URL=postgres://e31:e31@127.0.0.1:5432/e31 .venv/bin/python bench/image_pull.py [--size-mb 1000]
        [--rounds 3]

Builds one image (busybox plus ``--size-mb`` of random bytes, which no compression shrinks) with
umoci, pushes it to a local registry on 127.0.0.1 (Debian's docker-registry), then in alternating
rounds measures ``jobs.staging.stage_job`` pulling and unpacking it for a job (a new team each
round, so every round is a cache miss) against ``skopeo copy`` into an OCI layout plus
``umoci unpack`` run by hand on the same image. Figures are medians over the rounds; ``ratio`` is
by hand / staged (1.0: staging costs nothing beyond the tools). Then a second job of the last team
stages the same image, and the registry's access log says how many blob bytes it served for it.

Runs against a throwaway database (``bench_e31_images``, or $E31_BENCH_DB_NAME) and a folder in
/tmp, both removed afterwards. The last line printed is JSON.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "e31web.settings")
# Never the test suite's database: the bench creates and drops its own.
os.environ["E31_TEST_DB_NAME"] = os.environ.get("E31_BENCH_DB_NAME", "bench_e31_images")

import django

django.setup()

from django.test.utils import override_settings, setup_databases, teardown_databases  # noqa: E402
from django.utils import timezone  # noqa: E402

from accounts.models import Team  # noqa: E402
from jobs import dispatch, staging  # noqa: E402
from jobs.models import ImagePull, Job  # noqa: E402
from tests.images import registry as local  # noqa: E402

MB = 10**6
REFERENCE = "bench/big:1"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def settle() -> None:
    """No dirty pages left from the last run to slow the next."""
    os.sync()
    time.sleep(1.0)


def by_hand(host: str, work: Path, round_no: int) -> float:
    target = work / f"hand-{round_no}"
    target.mkdir()
    began = time.perf_counter()
    subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false", f"docker://{host}/{REFERENCE}",
                    f"oci:{target / 'oci'}:image"], check=True)  # fmt: skip
    subprocess.run(["umoci", "unpack", "--rootless", "--image", f"{target / 'oci'}:image", str(target / "bundle")],
                   check=True, capture_output=True)  # fmt: skip
    elapsed = time.perf_counter() - began
    shutil.rmtree(target)
    return elapsed


def staged(host: str, team: Team) -> tuple[float, Job]:
    now = timezone.now()
    job = Job.objects.create(
        team=team, name="bench", state="submitted", submitted_at=now, state_changed_at=now, argv=[],
        image=f"{host}/{REFERENCE}", gpus=1, hours=1, output_uri="file:///tmp/out", output_bytes=0,
    )  # fmt: skip
    began = time.perf_counter()
    staging.stage_job(job_id=job.id, now=timezone.now())
    elapsed = time.perf_counter() - began
    job.refresh_from_db()
    if job.state != "queued":
        raise SystemExit(f"staging failed: {job.end_detail}")
    return elapsed, job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="e31-bench-images-", dir="/tmp")).resolve()
    dispatch.request_scheduler_pass = lambda: None  # no broker in the bench: queueing is not staging
    old = setup_databases(verbosity=0, interactive=False, keepdb=False)
    (work / "registry").mkdir()
    registry = local.start(work / "registry")
    try:
        log(f"building an image of busybox and {args.size_mb} MB of random bytes")
        local.build_image(work / "layout", random_bytes=args.size_mb * MB)
        local.push(work / "layout", registry, REFERENCE)
        shutil.rmtree(work / "layout")
        with override_settings(E31_STAGING_ROOT=work / "staging", E31_POOL_REGISTRIES=[registry.host],
                               E31_STAGE_CACHE_BYTES=100 * args.size_mb * MB):  # fmt: skip
            hand, product, team = [], [], None
            for round_no in range(args.rounds):
                settle()
                hand.append(by_hand(registry.host, work, round_no))
                settle()
                team = Team.objects.create(name=f"bench-{round_no}", slug=f"bench-{round_no}")
                seconds, job = staged(registry.host, team)
                product.append(seconds)
                log(f"round {round_no + 1}: by hand {hand[-1]:.2f} s, staged {seconds:.2f} s")
            pulled = ImagePull.objects.get(job=job)
            before = registry.blob_bytes()
            second_s, second = staged(registry.host, team)
            moved = registry.blob_bytes() - before
            second_state = ImagePull.objects.get(job=second).stage_state
    finally:
        local.stop(registry)
        teardown_databases(old, verbosity=0)
        shutil.rmtree(work, ignore_errors=True)
    hand_s, staged_s = statistics.median(hand), statistics.median(product)
    print(json.dumps({
        "image_mb": round(pulled.bytes / MB, 1), "rounds": args.rounds, "by_hand_s": round(hand_s, 2),
        "staged_s": round(staged_s, 2), "ratio": round(hand_s / staged_s, 3),
        "second_job_blob_bytes": moved, "second_job_state": second_state, "second_job_s": round(second_s, 2),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
