"""The job page links each delivered output file to a download: the team's own, read from its folder."""

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs.models import Job, OutputFile
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


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
