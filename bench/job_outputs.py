"""A job with many output files: how large its API answer is and how long its page takes.

    DATABASE_URL=postgres://e31:e31@127.0.0.1:5432/e31 .venv/bin/python bench/job_outputs.py [--files 20000]

Creates a throwaway database (``bench_e31_outputs``, or $E31_BENCH_DB_NAME) from the migrations, one
released job that sealed ``--files`` files (manifest rows, bulk-created), then fetches
``GET /api/v1/jobs/{id}`` and the job page through the Django test client as a member of its team,
after a warm-up request. The last line printed is JSON: the API answer's and the page's size in
bytes, and the median of 5 fetches of each in milliseconds.
"""

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "e31web.settings")
os.environ["E31_TEST_DB_NAME"] = os.environ.get("E31_BENCH_DB_NAME", "bench_e31_outputs")

import django

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402

from accounts import services as accounts  # noqa: E402
from accounts.models import Membership, Team  # noqa: E402
from jobs import models  # noqa: E402

NOW = datetime.now(UTC)


def manifest(files: int) -> list[dict]:
    return [
        {
            "path": f"shards/{i:05d}/part.bin",
            "bytes": 1000 + i,
            "sha256": hashlib.sha256(str(i).encode()).hexdigest(),
        }
        for i in range(files)
    ]


def make_job(files: int) -> tuple[models.Job, str]:
    team = Team.objects.create(name="bench", slug="bench")
    user = get_user_model().objects.create_user(username="bench", password="bench")
    Membership.objects.create(team=team, user=user)
    entries = manifest(files)
    fields = dict(team=team, name="many-files", state="released", end_reason="succeeded", attempt=1,
                  submitted_at=NOW, state_changed_at=NOW, argv=["train"], gpus=1, hours=1.0,
                  output_uri="file:///results/bench/run", output_bytes=10**12, delivery_state="delivered",
                  delivered_at=NOW)  # fmt: skip
    if hasattr(models, "OutputFile"):  # the manifest in rows
        job = models.Job.objects.create(
            **fields, sealed_files=files, sealed_bytes=sum(e["bytes"] for e in entries)
        )
        models.OutputFile.objects.bulk_create(
            (models.OutputFile(job=job, attempt=1, **e) for e in entries), batch_size=5000
        )
    else:  # the manifest inline on the job, as it was
        job = models.Job.objects.create(**fields, outputs=entries)
    _, token = accounts.create_api_token(user=user, label="bench")
    return job, token


def timed(fetch) -> tuple[int, float]:
    fetch()  # warm-up
    sizes, times = [], []
    for _ in range(5):
        began = time.perf_counter()
        response = fetch()
        times.append((time.perf_counter() - began) * 1000)
        assert response.status_code == 200, response.status_code
        sizes.append(len(response.content))
    return sizes[-1], statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=20_000)
    args = parser.parse_args()
    old = setup_databases(verbosity=0, interactive=False, keepdb=False)
    try:
        job, token = make_job(args.files)
        api = Client(headers={"Authorization": f"Bearer {token}"})
        page = Client()
        page.force_login(job.team.memberships.first().user)
        api_bytes, api_ms = timed(lambda: api.get(f"/api/v1/jobs/{job.id}"))
        page_bytes, page_ms = timed(lambda: page.get(f"/jobs/{job.id}/"))
    finally:
        teardown_databases(old, verbosity=0)
    print(json.dumps({"files": args.files, "api_bytes": api_bytes, "api_ms": round(api_ms, 1),
                      "page_bytes": page_bytes, "page_ms": round(page_ms, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
