"""The job page links each delivered output file to a download: the team's own, read from its folder; and a
download holds one of the web process's sending places, as an export does, until its response is closed."""

import threading

import pytest
from django.urls import reverse
from django.utils import timezone

from common import export
from jobs.models import Job, OutputFile
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db
PATH = "eval/score & notes.txt"


@pytest.fixture
def delivered(roots, team):
    job = JobFactory(team=team, state="released", end_reason="succeeded", attempt=1, sealed_files=1,
                     output_uri=f"file://{roots.outputs}/run", delivery_state="delivered",
                     delivered_at=timezone.now())  # fmt: skip
    OutputFile.objects.create(job=job, attempt=1, path="eval/score & notes.txt", bytes=2, sha256="0" * 64)
    folder = roots.outputs / "run" / f"{job.id}-1" / "eval"
    folder.mkdir(parents=True)
    (folder / "score & notes.txt").write_bytes(b"42")
    return job


def test_the_job_page_links_each_delivered_file_and_the_link_downloads_it(delivered, member_client):
    page = member_client.get(reverse("jobs:detail", args=[delivered.id])).content.decode()
    href = reverse("jobs:output", args=[delivered.id]) + "?path=eval/score%20%26%20notes.txt"
    assert f'<a href="{href}" download>eval/score &amp; notes.txt</a>' in page
    got = member_client.get(href)
    assert got.status_code == 200 and b"".join(got.streaming_content) == b"42"
    assert 'filename="score & notes.txt"' in got["Content-Disposition"]


def test_another_team_gets_a_404_and_an_undelivered_file_a_409_with_no_link(
    delivered, member_client, outsider_client
):
    url = reverse("jobs:output", args=[delivered.id])
    assert outsider_client.get(url, {"path": "eval/score & notes.txt"}).status_code == 404
    assert member_client.get(url, {"path": "../secret"}).status_code == 404
    Job.objects.filter(id=delivered.id).update(delivered_at=None, delivery_state="delivering")
    assert member_client.get(url, {"path": "eval/score & notes.txt"}).status_code == 409
    page = member_client.get(reverse("jobs:detail", args=[delivered.id])).content.decode()
    assert "eval/score &amp; notes.txt" in page and url not in page


def test_a_job_delivered_to_a_destination_with_a_query_serves_no_other_jobs_bytes(roots, team, member_client):
    """Delivered before intake refused "?" in a file URI: its folder went into the query, so the path read back is
    the shared folder itself, where another job's file of the same name lies. Nothing is served for it."""
    job = JobFactory(team=team, state="released", end_reason="succeeded", attempt=1, sealed_files=1,
                     output_uri=f"file://{roots.outputs}/shared?x", delivery_state="delivered",
                     delivered_at=timezone.now())  # fmt: skip
    OutputFile.objects.create(job=job, attempt=1, path="model.bin", bytes=5, sha256="0" * 64)
    (roots.outputs / "shared").mkdir()
    (roots.outputs / "shared" / "model.bin").write_bytes(b"7f3e9")  # another job's delivery
    got = member_client.get(reverse("jobs:output", args=[job.id]), {"path": "model.bin"})
    assert got.status_code == 404 and b"7f3e9" not in got.content


def test_a_download_holds_a_place_until_it_is_closed(
    client, member_token, member_client, delivered, monkeypatch
):
    """A client that asked for a large output and never read it held a web thread for as long as it liked: two
    such sockets stopped a 1-worker, 2-thread gunicorn from answering anything for 10 s, sixteen would stop a
    production machine. Exports were bounded; downloads were not."""
    monkeypatch.setattr(export, "_SENDING", threading.BoundedSemaphore(1))
    auth = {"HTTP_AUTHORIZATION": f"Bearer {member_token}"}
    api_url = f"/api/v1/jobs/{delivered.id}/outputs/download"
    page_url = reverse("jobs:output", args=[delivered.id])

    first = client.get(api_url, {"path": PATH}, **auth)  # sent, never read
    assert first.status_code == 200
    busy_api = client.get(api_url, {"path": PATH}, **auth)
    assert busy_api.status_code == 429 and busy_api["Retry-After"] == str(export.BUSY_RETRY_S)
    assert "being sent" in busy_api.json()["detail"]
    busy_page = member_client.get(page_url, {"path": PATH})
    assert busy_page.status_code == 429 and busy_page["Retry-After"] == str(export.BUSY_RETRY_S)

    assert b"".join(first.streaming_content) == b"42"  # read to its end: the server closes the response

    again = member_client.get(page_url, {"path": PATH})
    assert again.status_code == 200 and b"".join(again.streaming_content) == b"42"
    assert client.get(api_url, {"path": PATH}, **auth).status_code == 200


def test_a_log_download_holds_a_place_too(member_client, delivered, monkeypatch):
    monkeypatch.setattr(export, "_SENDING", threading.BoundedSemaphore(0))  # every place taken
    monkeypatch.setattr("jobs.logs.check_exists", lambda job, attempt, rank: None)
    busy = member_client.get(reverse("jobs:log", args=[delivered.id]), {"attempt": "1"})
    assert busy.status_code == 429 and busy["Retry-After"] == str(export.BUSY_RETRY_S)
