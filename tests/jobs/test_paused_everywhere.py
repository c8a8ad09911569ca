"""A pausable job between attempts reads "paused (checkpoint 1.2 GB)" wherever its team or an operator
looks - the job list, the operator's jobs page, the API and the terminal - not a bare "queued"."""

import pytest
from django.utils import timezone

from jobs import rental
from jobs.models import Job
from tests.cli.inprocess import e31
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db
PAUSED = "paused (checkpoint 1.2 GB)"


@pytest.fixture
def paused_job(team, member):
    job = JobFactory(
        team=team, submitted_by=member, name="trainer", state="running", attempt=1, preemptible=True,
        checkpoint_signal="USR1", checkpoint_grace_s=2, checkpoint_bytes=2_000_000_000,
    )  # fmt: skip
    rental.note_checkpoint(job_id=job.id, attempt=1, held_bytes=1_200_000_000, note="", now=timezone.now())
    Job.objects.filter(id=job.id).update(state="queued")
    return job


@pytest.fixture
def waiting_job(team, member):
    return JobFactory(team=team, submitted_by=member, name="plain", state="queued", attempt=1)


def test_the_job_list_and_the_operators_jobs_page_say_paused(
    member_client, operator_client, paused_job, waiting_job
):
    for client, url in ((member_client, "/jobs/"), (operator_client, "/operator/jobs/")):
        html = client.get(url).content.decode()
        assert html.count(PAUSED) == 1, url  # the pausable job only; the plain one stays "queued"


def test_the_api_says_paused_for_the_pausable_job_only(client, member_token, paused_job, waiting_job):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {member_token}"}
    listed = {j["id"]: j["paused"] for j in client.get("/api/v1/jobs", **auth).json()["items"]}
    assert listed == {paused_job.id: PAUSED, waiting_job.id: ""}
    assert client.get(f"/api/v1/jobs/{paused_job.id}", **auth).json()["paused"] == PAUSED


def test_the_terminal_says_paused_in_show_and_ls(monkeypatch, member_token, paused_job, waiting_job):
    code, out, _ = e31(monkeypatch, member_token, "show", str(paused_job.id))
    assert code == 0 and f"queued, {PAUSED}" in out
    code, out, _ = e31(monkeypatch, member_token, "ls")
    assert code == 0 and "paused" in out and out.count("paused") == 1
