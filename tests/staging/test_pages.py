"""What teams and operators see of transfers: progress, rate, ETA, cached, the cache's policy."""

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs import staging
from jobs.models import Allocation, DataInput, Job, OutputFile, OutputTransfer
from tests.factories import JobFactory, NodeFactory
from tests.staging.conftest import file_uri, make_job, write

pytestmark = pytest.mark.django_db


def copying(team, *, done: int, total: int, rate: float) -> Job:
    job = make_job(
        team, {"name": "train", "uri": "https://data.example/train.bin", "bytes": total}, state="staging"
    )
    Job.objects.filter(id=job.id).update(worker_seen_at=timezone.now())
    DataInput.objects.filter(job=job).update(stage_state="staging", bytes_done=done, rate_bytes_s=rate)
    return job


def test_the_job_page_shows_each_inputs_progress_rate_and_eta(member_client, team, settings):
    settings.E31_STAGE_CACHE_BYTES, settings.E31_STAGE_RETENTION_S = 500 * 10**9, 2 * 86400
    job = copying(team, done=400_000_000, total=1_000_000_000, rate=100_000_000)
    html = member_client.get(reverse("jobs:live", args=[job.id]), HTTP_HX_REQUEST="true").content.decode()
    assert 'hx-trigger="every 2s"' in html
    assert "400.0 MB of 1.0 GB" in html and "100.0 MB/s" in html and "about 6.0 s left" in html
    assert "shared staging cache, which every node reads" in html
    assert "past 500.0 GB" in html and "after 48 h 00 min unused" in html and "has not published" in html


def test_a_cached_input_says_so_on_the_job_page(member_client, team, roots):
    path, _ = write(roots.datasets / "d.bin", b"d" * 10)
    spec = {"name": "d", "uri": file_uri(path), "bytes": 10}
    staging.stage_job(job_id=make_job(team, spec).id, now=timezone.now())
    again = make_job(team, spec, name="again")
    staging.stage_job(job_id=again.id, now=timezone.now())
    html = member_client.get(reverse("jobs:detail", args=[again.id])).content.decode()
    assert "cached" in html and "served from the pool cache: 0 bytes moved" in html


def test_the_job_page_shows_delivery_progress(member_client, team):
    now = timezone.now()
    job = JobFactory(team=team, state="released", end_reason="succeeded", attempt=1, delivery_state="delivering",
                     sealed_files=1, sealed_bytes=2_000_000)  # fmt: skip
    OutputFile.objects.create(job=job, attempt=1, path="m.bin", bytes=2_000_000, sha256="0" * 64)
    allocation = Allocation.objects.create(job=job, attempt=1, node=NodeFactory(), gpu_indices=[0], rented_at=now,
                                           released_at=now)  # fmt: skip
    OutputTransfer.objects.create(allocation=allocation, job=job, state="delivering", bytes_total=2_000_000,
                                  bytes_done=500_000, rate_bytes_s=250_000, files_total=1, updated_at=now)  # fmt: skip
    html = member_client.get(reverse("jobs:detail", args=[job.id])).content.decode()
    assert "delivering · 500.0 KB of 2.0 MB · 0 of 1 file" in html
    assert "250.0 KB/s" in html and "about 6.0 s left" in html and "off the meter" in html


def test_the_api_reports_bytes_done_rate_and_eta_for_each_input(client, team, member_token):
    job = copying(team, done=250, total=1000, rate=50)
    body = client.get(f"/api/v1/jobs/{job.id}", HTTP_AUTHORIZATION=f"Bearer {member_token}").json()
    data = body["data"][0]
    assert (data["stage_state"], data["bytes_done"], data["rate_bytes_s"], data["eta_s"]) == (
        "staging",
        250,
        50.0,
        15.0,
    )


def test_operators_see_every_transfer_in_flight(operator_client, team, other_team):
    copying(team, done=10, total=100, rate=5)
    copying(other_team, done=0, total=100, rate=0)
    now = timezone.now()
    job = JobFactory(team=team, name="deliverer", state="released", end_reason="succeeded", attempt=1)
    allocation = Allocation.objects.create(job=job, attempt=1, node=NodeFactory(name="gpu-77"), gpu_indices=[0],
                                           rented_at=now, released_at=now)  # fmt: skip
    OutputTransfer.objects.create(allocation=allocation, job=job, state="delivering", bytes_total=100,
                                  bytes_done=50, updated_at=now)  # fmt: skip
    html = operator_client.get(reverse("jobs:transfers")).content.decode()
    assert html.count("https://data.example/train.bin") == 2
    assert "vision" in html and "audio" in html and "gpu-77" in html and "deliverer" in html
    assert "Configured policy of this pool" in html
    live = operator_client.get(reverse("jobs:transfers"), HTTP_HX_REQUEST="true").content.decode()
    assert live.lstrip().startswith('<div id="transfers-live"') and "<html" not in live


def test_the_transfers_page_does_not_exist_for_team_members(member_client):
    assert member_client.get(reverse("jobs:transfers")).status_code == 404
    assert "Transfers" not in member_client.get(reverse("jobs:list")).content.decode()


def test_operators_get_a_transfers_link(operator_client):
    assert reverse("jobs:transfers") in operator_client.get(reverse("jobs:list")).content.decode()
