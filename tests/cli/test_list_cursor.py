"""`e31` reads long job lists page after page by the last job it was given, so no job is skipped as the list
changes underneath."""

import pytest

from e31cli import client
from jobs.models import Job
from tests.cli.inprocess import e31
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_queue_lists_every_waiting_job_while_others_start(monkeypatch, member, team, member_token):
    """Pages were read by offset: ten jobs that started between two page reads left the waiting list, the second
    page began ten rows further on, and ten jobs still waiting were never listed."""
    jobs = [JobFactory(team=team, submitted_by=member, state="queued") for _ in range(150)]
    newest = [job.id for job in jobs[-10:]]
    get, pages_read = client.Api.get, []

    def the_scheduler_starts_ten_between_two_pages(self, path, **params):
        answer = get(self, path, **params)
        if path == "/jobs":
            pages_read.append(params)
            if len(pages_read) == 1:
                Job.objects.filter(id__in=newest).update(state="running")
        return answer

    monkeypatch.setattr(client.Api, "get", the_scheduler_starts_ten_between_two_pages)
    code, out, err = e31(monkeypatch, member_token, "queue")
    assert code == 0, err
    listed = {int(line.split()[0]) for line in out.splitlines()[1:] if line.strip()[:1].isdigit()}
    assert set(Job.objects.filter(state="queued").values_list("id", flat=True)) <= listed
    assert len(pages_read) == 2


def test_a_cursor_is_a_job_the_caller_can_see(client, member_token, other_team):
    theirs = JobFactory(team=other_team)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {member_token}"}
    response = client.get("/api/v1/jobs", {"before": theirs.id}, **auth)
    assert response.status_code == 422 and "before" in response.json()["detail"]
