"""A download holds one of the web process's sending places, as an export does, until its response is closed."""

import threading

import pytest
from django.urls import reverse
from django.utils import timezone

from common import export
from jobs.models import OutputFile
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def delivered(roots, team):
    job = JobFactory(team=team, state="released", end_reason="succeeded", attempt=1, sealed_files=1,
                     output_uri=f"file://{roots.outputs}/run", delivery_state="delivered",
                     delivered_at=timezone.now())  # fmt: skip
    OutputFile.objects.create(job=job, attempt=1, path="model.bin", bytes=5, sha256="0" * 64)
    folder = roots.outputs / "run" / f"{job.id}-1"
    folder.mkdir(parents=True)
    (folder / "model.bin").write_bytes(b"bytes")
    return job


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

    first = client.get(api_url, {"path": "model.bin"}, **auth)  # sent, never read
    assert first.status_code == 200
    busy_api = client.get(api_url, {"path": "model.bin"}, **auth)
    assert busy_api.status_code == 429 and busy_api["Retry-After"] == str(export.BUSY_RETRY_S)
    assert "being sent" in busy_api.json()["detail"]
    busy_page = member_client.get(page_url, {"path": "model.bin"})
    assert busy_page.status_code == 429 and busy_page["Retry-After"] == str(export.BUSY_RETRY_S)

    assert b"".join(first.streaming_content) == b"bytes"  # read to its end: the server closes the response

    again = member_client.get(page_url, {"path": "model.bin"})
    assert again.status_code == 200 and b"".join(again.streaming_content) == b"bytes"
    assert client.get(api_url, {"path": "model.bin"}, **auth).status_code == 200


def test_a_log_download_holds_a_place_too(member_client, delivered, monkeypatch):
    monkeypatch.setattr(export, "_SENDING", threading.BoundedSemaphore(0))  # every place taken
    monkeypatch.setattr("jobs.logs.check_exists", lambda job, attempt, rank: None)
    busy = member_client.get(reverse("jobs:log", args=[delivered.id]), {"attempt": "1"})
    assert busy.status_code == 429 and busy["Retry-After"] == str(export.BUSY_RETRY_S)
