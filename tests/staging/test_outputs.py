"""What an attempt may leave behind: its declared bytes, at most E31_MAX_OUTPUT_FILES files, a manifest in rows."""

import hashlib
import sys
import time

import fsspec
import pytest
from django.urls import reverse
from django.utils import timezone

from jobs import agent, rental, sandbox
from jobs.lifecycle import EndReason
from jobs.models import Allocation, Job, OutputFile
from jobs.transfers import sources
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db


def running_part(team, *, output_bytes: int, parts: int = 1) -> list[agent.Part]:
    """A job running on ``parts`` nodes, its process(es) just exited: each part is ready to seal."""
    now = timezone.now()
    job = JobFactory(team=team, state="running", attempt=1, output_bytes=output_bytes, gpus=parts,
                     output_uri="file:///results/vision/run")  # fmt: skip
    for rank in range(parts):
        Allocation.objects.create(job=job, attempt=1, node=NodeFactory(), rank=rank, gpu_indices=[0],
                                  rented_at=now, started_at=now)  # fmt: skip
    return [
        agent._load_part(a.id, sandbox.UNSANDBOXED, ())
        for a in Allocation.objects.filter(job=job).order_by("rank")
    ]


def finish(part: agent.Part) -> Job:
    """The agent's work once the process exited well: finish, seal, and (last part) release."""
    dirs = sandbox.attempt_dirs(part.allocation)
    agent._after_exit(part, dirs, EndReason.SUCCEEDED, 0)
    return Job.objects.get(id=part.job.id)


def write_outputs(part: agent.Part, files: dict[str, bytes]) -> None:
    output = sandbox.attempt_dirs(part.allocation).output
    for rel, content in files.items():
        (output / rel).parent.mkdir(parents=True, exist_ok=True)
        (output / rel).write_bytes(content)


def test_an_output_larger_than_declared_ends_the_job_output_failed(roots, team):
    """Reproduction 6: a job declaring output.bytes = 100 delivered 5 MB."""
    (part,) = running_part(team, output_bytes=100)
    write_outputs(part, {"big.bin": b"x" * 5_000_000})
    job = finish(part)
    assert (job.state, job.end_reason, job.exit_code) == ("released", "output_failed", 0)
    assert "wrote 5,000,000 bytes, declared 100" in job.end_detail
    assert job.delivery_state == "" and not job.outputs_pending()
    assert not OutputFile.objects.filter(job=job).exists()
    assert not job.allocations.filter(released_at__isnull=True).exists()  # the meter stopped


def test_more_files_than_the_cap_end_the_job_output_failed_without_hashing_them(
    roots, team, settings, monkeypatch
):
    """Reproduction 6: 20,000 files were accepted, delivery took ~100 s, the manifest went inline."""
    assert settings.E31_MAX_OUTPUT_FILES == 10_000  # the default
    (part,) = running_part(team, output_bytes=10**9)
    output = sandbox.attempt_dirs(part.allocation).output
    output.mkdir(parents=True, exist_ok=True)
    for i in range(20_000):
        (output / f"f{i:05d}").write_bytes(b"")
    hashed = []
    monkeypatch.setattr(agent, "_entry", lambda *args: hashed.append(args))
    began = time.monotonic()
    job = finish(part)
    print(f"\n20,000 files refused in {time.monotonic() - began:.2f} s")
    assert (job.end_reason, job.delivery_state) == ("output_failed", "")
    assert "wrote more than 10,000 files" in job.end_detail and "E31_MAX_OUTPUT_FILES" in job.end_detail
    assert not OutputFile.objects.filter(job=job).exists()
    assert hashed == []  # refused on the count alone: not one file was read


def test_the_cap_is_configurable(roots, team, settings):
    settings.E31_MAX_OUTPUT_FILES = 3
    (part,) = running_part(team, output_bytes=1000)
    write_outputs(part, {f"{i}.txt": b"x" for i in range(4)})
    assert "wrote more than 3 files" in finish(part).end_detail


def test_parts_that_together_write_more_than_declared_end_output_failed(roots, team):
    first, second = running_part(team, output_bytes=150, parts=2)
    write_outputs(first, {"a.bin": b"a" * 100})
    write_outputs(second, {"b.bin": b"b" * 100})
    finish(first)
    job = finish(second)
    assert job.end_reason == "output_failed" and "wrote 200 bytes, declared 150" in job.end_detail


def test_a_sealed_manifest_is_stored_a_row_per_file_with_its_summary(
    roots, team, django_capture_on_commit_callbacks
):
    (part,) = running_part(team, output_bytes=1000)
    files = {"model.bin": b"m" * 300, "logs/train.txt": b"loss 0.1\n"}
    write_outputs(part, files)
    with django_capture_on_commit_callbacks() as callbacks:
        job = finish(part)
    assert (job.end_reason, job.delivery_state) == ("succeeded", "delivering")
    assert (job.sealed_files, job.sealed_bytes) == (2, 309)
    rows = {(r.attempt, r.path, r.bytes, r.sha256) for r in OutputFile.objects.filter(job=job)}
    assert rows == {(1, p, len(b), hashlib.sha256(b).hexdigest()) for p, b in files.items()}
    assert callbacks, "delivery is enqueued after commit"


def test_a_redelivered_seal_adds_nothing_twice(roots, team):
    first, _waiting = running_part(team, output_bytes=1000, parts=2)
    write_outputs(first, {"a.bin": b"a"})
    finish(first)
    rental.seal_allocation(allocation_id=first.allocation.id, manifest=[{"path": "rank0/a.bin", "bytes": 1,
                           "sha256": "0" * 64}], now=timezone.now())  # fmt: skip
    assert OutputFile.objects.filter(job=first.job).count() == 1


@pytest.fixture
def many_files(team):
    """A released job whose attempt sealed 20,000 files (the reproduction's count), as rows."""
    now = timezone.now()
    job = JobFactory(team=team, state="released", end_reason="succeeded", attempt=1, sealed_files=20_000,
                     sealed_bytes=20_000 * 1000, delivery_state="delivered", delivered_at=now)  # fmt: skip
    OutputFile.objects.bulk_create(
        (
            OutputFile(job=job, attempt=1, path=f"shards/{i:05d}.bin", bytes=1000, sha256="ab" * 32)
            for i in range(20_000)
        ),
        batch_size=5000,
    )
    return job


def test_the_api_shows_a_summary_and_pages_through_the_files(client, member_token, many_files):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {member_token}"}
    response = client.get(f"/api/v1/jobs/{many_files.id}", **auth)
    assert response.status_code == 200 and len(response.content) < 4000, len(response.content)
    summary = response.json()["outputs"]
    assert (summary["files"], summary["bytes"]) == (20_000, 20_000_000)
    assert summary["delivered_to"] == f"file:///tmp/out/{many_files.id}-1/"
    page = client.get(f"{summary['files_url']}?offset=19990&limit=50", **auth).json()
    assert page["count"] == 20_000 and len(page["items"]) == 10
    assert page["items"][0] == {"path": "shards/19990.bin", "bytes": 1000, "sha256": "ab" * 32}
    too_many = client.get(f"{summary['files_url']}?limit=5000", **auth).json()
    assert len(too_many["items"]) == 1000  # a page holds at most 1,000 files


def test_another_team_cannot_list_a_jobs_files(client, outsider, many_files):
    from accounts import services as accounts

    _, token = accounts.create_api_token(user=outsider, label="tests")
    response = client.get(f"/api/v1/jobs/{many_files.id}/outputs", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 404


def test_the_job_page_shows_a_summary_and_a_page_of_files(member_client, many_files):
    response = member_client.get(reverse("jobs:detail", args=[many_files.id]))
    html = response.content.decode()
    assert "20000 files · 20.0 MB" in html and "1\u201350 of 20000" in html
    assert "shards/00049.bin" in html and "shards/00050.bin" not in html
    assert len(response.content) < 100_000, len(response.content)
    last = member_client.get(reverse("jobs:detail", args=[many_files.id]) + "?files=400").content.decode()
    assert "shards/19999.bin" in last and "page 400 of 400" in last


def test_a_download_reads_the_current_attempts_file_from_its_own_folder_under_the_team(
    client, member_token, roots, team
):
    """The download reads the attempt's delivery folder: never an older attempt's file, nor a planted link."""
    now = timezone.now()
    job = JobFactory(team=team, state="released", end_reason="succeeded", attempt=2, sealed_files=2,
                     output_uri=f"file://{roots.outputs}/run", delivery_state="delivered", delivered_at=now)  # fmt: skip
    OutputFile.objects.create(job=job, attempt=1, path="old.txt", bytes=3, sha256="0" * 64)
    for path in ("model.txt", "leak.txt"):
        OutputFile.objects.create(job=job, attempt=2, path=path, bytes=5, sha256="0" * 64)
    folder = roots.outputs / "run" / f"{job.id}-2"
    folder.mkdir(parents=True)
    (folder / "model.txt").write_bytes(b"mine!")
    (roots.outputs / "run" / f"{job.id}-1").mkdir()
    (roots.outputs / "run" / f"{job.id}-1" / "old.txt").write_bytes(b"old")
    (roots.outside / "secret.txt").write_bytes(b"nope!")
    (folder / "leak.txt").symlink_to(roots.outside / "secret.txt")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {member_token}"}
    url = f"/api/v1/jobs/{job.id}/outputs/download"
    got = client.get(url, {"path": "model.txt"}, **auth)
    assert got.status_code == 200 and b"".join(got.streaming_content) == b"mine!"
    assert client.get(url, {"path": "old.txt"}, **auth).status_code == 404  # attempt 1's file
    assert client.get(url, {"path": "leak.txt"}, **auth).status_code == 404  # leads out of the team's folder
    Job.objects.filter(id=job.id).update(delivered_at=None, delivery_state="delivering")
    assert client.get(url, {"path": "model.txt"}, **auth).status_code == 409


@pytest.mark.parametrize(
    "folder, path, why",
    [
        ("audio/run", "model.bin", "not under the team's prefix"),
        ("vision/run", "../../audio/secret.bin", "not a plain object key"),
    ],
)
def test_a_download_from_s3_is_read_only_under_the_teams_prefix(
    client, member_token, team, settings, folder, path, why
):
    """The console opens delivered s3:// objects with its own credentials: only under the team's prefix of
    the S3 roots configured now, and only a plain key (a manifest path with ``..`` leads nowhere)."""
    settings.E31_S3_ROOTS = ["s3://bucket"]
    now = timezone.now()
    job = JobFactory(team=team, state="released", end_reason="succeeded", attempt=1, sealed_files=1,
                     output_uri=f"s3://bucket/{folder}", delivery_state="delivered", delivered_at=now)  # fmt: skip
    OutputFile.objects.create(job=job, attempt=1, path=path, bytes=5, sha256="0" * 64)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {member_token}"}
    got = client.get(f"/api/v1/jobs/{job.id}/outputs/download", {"path": path}, **auth)
    assert got.status_code == 404 and why in got.content.decode()


@pytest.mark.parametrize("console", ["object gone", "no s3 extra"])
def test_an_s3_output_the_console_cannot_read_is_answered_not_a_500(
    client, member_token, team, settings, monkeypatch, console
):
    """The object removed from the bucket since, or a console installed without the s3 extra (its nodes have it):
    both answered 500, an HTML page on an API route."""
    settings.E31_S3_ROOTS = ["s3://bucket"]
    if console == "object gone":
        bucket = fsspec.filesystem("memory")
        bucket.store.clear()
        monkeypatch.setattr(sources, "filesystem_for", lambda uri: bucket)
    else:
        monkeypatch.setitem(sys.modules, "s3fs", None)
    job = JobFactory(team=team, state="released", end_reason="succeeded", attempt=1, sealed_files=1,
                     output_uri="s3://bucket/vision/run", delivery_state="delivered", delivered_at=timezone.now())  # fmt: skip
    OutputFile.objects.create(job=job, attempt=1, path="model.bin", bytes=5, sha256="0" * 64)
    client.raise_request_exception = False
    got = client.get(f"/api/v1/jobs/{job.id}/outputs/download", {"path": "model.bin"},
                     HTTP_AUTHORIZATION=f"Bearer {member_token}")  # fmt: skip
    expected = {"object gone": (404, "no longer at the destination"), "no s3 extra": (503, "s3")}[console]
    assert (got.status_code, expected[1] in got.json()["detail"]) == (expected[0], True)
