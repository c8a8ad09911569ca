"""Another team's job does not exist for you: every job URL and API endpoint answers 404."""

from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from jobs.models import Allocation, Job
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(team):
    return JobFactory(team=team)


def html_urls(job):
    return [
        ("get", reverse("jobs:detail", args=[job.id])),
        ("get", reverse("jobs:live", args=[job.id])),
        ("post", reverse("jobs:cancel", args=[job.id])),
    ]


def api_urls(job):
    return [("get", f"/api/v1/jobs/{job.id}"), ("post", f"/api/v1/jobs/{job.id}/cancel")]


def test_every_job_url_is_a_404_for_another_team(job, outsider_client):
    for method, url in html_urls(job) + api_urls(job):
        response = getattr(outsider_client, method)(url)
        assert response.status_code == 404, (method, url, response.status_code)
    job.refresh_from_db()
    assert job.state == "queued"  # the cancel attempts changed nothing


def test_another_teams_jobs_are_not_listed(job, outsider_client):
    assert job.name not in outsider_client.get(reverse("jobs:list")).content.decode()
    assert outsider_client.get("/api/v1/jobs").json()["count"] == 0
    assert job.name not in outsider_client.get(reverse("jobs:queue")).content.decode()


def test_the_owning_team_and_operators_see_the_job(job, member_client, operator_client):
    for client in (member_client, operator_client):
        assert client.get(reverse("jobs:detail", args=[job.id])).status_code == 200
        assert client.get(f"/api/v1/jobs/{job.id}").status_code == 200


def test_anonymous_users_are_sent_to_login_and_api_callers_get_401(job, client):
    for method, url in [*html_urls(job), ("get", reverse("jobs:list")), ("get", reverse("jobs:new"))]:
        response = getattr(client, method)(url)
        assert response.status_code == 302 and response["Location"].startswith(reverse("accounts:login")), url
    for method, url in [*api_urls(job), ("get", "/api/v1/jobs"), ("post", "/api/v1/jobs")]:
        assert getattr(client, method)(url).status_code == 401, url


def test_the_job_list_filters_by_state_and_pages_newest_first(team, member_client):
    for i in range(30):
        JobFactory(
            team=team,
            name=f"j{i:02d}",
            state="ended" if i % 2 else "queued",
            end_reason="cancelled" if i % 2 else "",
        )
    page = member_client.get(reverse("jobs:list"), {"state": "queued"}).context["page"]
    assert {j.state for j in page} == {"queued"} and page.paginator.count == 15
    first = member_client.get(reverse("jobs:list")).context["page"]
    assert len(first) == 25 and first[0].name == "j29"


def test_the_job_list_runs_a_bounded_number_of_queries(team, member_client, django_assert_max_num_queries):
    for i in range(60):
        JobFactory(team=team, name=f"j{i}")
    with django_assert_max_num_queries(8):
        member_client.get(reverse("jobs:list"))


def test_the_live_fragment_polls_while_alive_and_stops_at_the_end(job, member_client):
    url = reverse("jobs:live", args=[job.id])
    assert 'hx-trigger="every 2s"' in member_client.get(url, HTTP_HX_REQUEST="true").content.decode()
    job.state, job.end_reason = "ended", "cancelled"
    job.save()
    assert "hx-trigger" not in member_client.get(url, HTTP_HX_REQUEST="true").content.decode()


def test_cancel_from_the_page_ends_a_queued_job_unmetered(job, member_client):
    member_client.post(reverse("jobs:cancel", args=[job.id]))
    job.refresh_from_db()
    assert (job.state, job.end_reason) == ("ended", "cancelled") and not job.allocations.exists()


def _stopping(team, node, now) -> Job:
    """A running job a teammate asked to cancel a moment ago: its node agent is still stopping it."""
    job = JobFactory(team=team, state="running", attempt=1, cancel_requested_at=now)
    Allocation.objects.create(
        job=job, node=node, attempt=1, rank=0, gpu_indices=[0],
        rented_at=now - timedelta(minutes=5), started_at=now - timedelta(minutes=4),
    )  # fmt: skip
    return job


def test_cancel_pressed_while_a_cancel_is_pending_says_so_not_that_the_job_ended(team, member_client, pool):
    """A teammate asked to cancel a running job a moment ago and its node agent is still stopping it; a
    member presses Cancel job: the page says the cancel is already requested, and the job lives on."""
    job = _stopping(team, pool[0], timezone.now())
    answer = member_client.post(reverse("jobs:cancel", args=[job.id]))
    assert answer.status_code == 302 and Job.objects.get(id=job.id).is_alive
    said = [str(m) for m in get_messages(answer.wsgi_request)]
    assert len(said) == 1 and "cancel already requested at" in said[0] and "already ended" not in said[0]


def test_cancel_through_the_api_while_a_cancel_is_pending_answers_as_the_first_did(
    team, member_client, member_token, pool
):
    """Reproduction: `e31 cancel 18` twice while its node agent was still stopping it said "Job 18 is running:
    nothing to cancel" (409, exit 5): a retried cancel read as a failed one. It is the same request: 200, the job."""
    now = timezone.now()
    job = _stopping(team, pool[0], now)
    answer = member_client.post(f"/api/v1/jobs/{job.id}/cancel", HTTP_AUTHORIZATION=f"Bearer {member_token}")
    assert answer.status_code == 200 and answer.json()["state"] == "running"
    assert Job.objects.get(id=job.id).cancel_requested_at == now


def test_cancel_pressed_on_an_ended_job_says_it_has_ended(team, member_client):
    """A member presses Cancel job on a job that has ended meanwhile: the page says it has already ended."""
    job = JobFactory(team=team, state="ended", end_reason="succeeded")
    answer = member_client.post(reverse("jobs:cancel", args=[job.id]))
    assert [str(m) for m in get_messages(answer.wsgi_request)] == [f"Job #{job.id} has already ended."]


def test_cancel_through_the_api_twice_is_a_409_the_second_time(job, member_client, member_token):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {member_token}"}
    assert member_client.post(f"/api/v1/jobs/{job.id}/cancel", **headers).json()["state"] == "ended"
    assert member_client.post(f"/api/v1/jobs/{job.id}/cancel", **headers).status_code == 409
