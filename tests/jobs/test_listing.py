"""Job lists stay fast: filtered, ordered and paged in the database, in a constant number of queries."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from common import paging
from jobs import api as jobs_api
from jobs import views
from jobs.models import DataInput, Job, JobEvent
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture
def api(member_client, member_token):
    member_client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {member_token}"
    return member_client


def make_jobs(team, count: int, **fields):
    jobs = []
    for i in range(count):
        job = JobFactory(team=team, name=f"train-{i:03d}", submitted_at=T0 + timedelta(hours=i), **fields)
        DataInput.objects.create(job=job, position=0, name="corpus", uri="file:///d/corpus", bytes=10)
        JobEvent.objects.create(job=job, to_state="queued", at=job.submitted_at)
        jobs.append(job)
    return jobs


def test_the_api_list_turns_only_the_requested_page_into_json(api, team, monkeypatch):
    make_jobs(team, 30)
    serialised = []
    real = jobs_api.job_json
    monkeypatch.setattr(jobs_api, "job_json", lambda job: serialised.append(job.id) or real(job))
    with CaptureQueriesContext(connection) as queries:
        body = api.get("/api/v1/jobs", {"limit": 5}).json()
    assert body["count"] == 30 and [j["name"] for j in body["items"]] == [
        f"train-{i:03d}" for i in range(29, 24, -1)
    ]
    assert len(serialised) == 5
    job_reads = [q["sql"] for q in queries.captured_queries if 'FROM "jobs_job"' in q["sql"]]
    assert job_reads and all("LIMIT" in sql or "COUNT(" in sql for sql in job_reads), job_reads


def test_the_api_list_runs_the_same_queries_for_3_jobs_as_for_40(api, team, django_assert_num_queries):
    make_jobs(team, 3)
    api.get("/api/v1/jobs")  # the throttle's first event in a window also clears expired windows: not per job
    with CaptureQueriesContext(connection) as few:
        assert len(api.get("/api/v1/jobs").json()["items"]) == 3
    make_jobs(team, 37)
    with django_assert_num_queries(len(few.captured_queries)):
        assert len(api.get("/api/v1/jobs").json()["items"]) == 40


def test_the_api_list_filters_by_name_state_and_submission_time(api, team, other_team):
    make_jobs(team, 6)
    JobFactory(team=team, name="eval-bert", state="released", end_reason="succeeded", submitted_at=T0)
    JobFactory(team=other_team, name="train-secret")

    def names(**params):
        return [j["name"] for j in api.get("/api/v1/jobs", params).json()["items"]]

    assert names(name="EVAL") == ["eval-bert"]
    assert names(state="released") == ["eval-bert"]
    assert names(state="finished") == ["eval-bert"]
    assert "eval-bert" not in names(state="alive") and len(names(state="alive")) == 6
    since, until = (T0 + timedelta(hours=2)).isoformat(), (T0 + timedelta(hours=4)).isoformat()
    assert names(since=since, until=until) == ["train-003", "train-002"]
    assert "train-secret" not in names(name="secret")


def test_the_api_refuses_an_unknown_state_or_a_malformed_time(api):
    for params in ({"state": "exploded"}, {"since": "yesterday-ish"}):
        response = api.get("/api/v1/jobs", params)
        assert response.status_code == 422, params
        assert response.json()["errors"], params


def test_the_job_page_list_filters_by_name_and_days_and_keeps_them_in_the_pager(team, member_client):
    make_jobs(team, 60)  # one per hour from T0: 24 on Nov 1, 24 on Nov 2, 12 on Nov 3
    response = member_client.get(
        reverse("jobs:list"), {"name": "train-0", "since": "2026-11-02", "until": "2026-11-03"}
    )
    page = response.context["page"]
    assert page.paginator.count == 36 and page[0].name == "train-059" and page[24].name == "train-035"
    html = response.content.decode()
    assert "?name=train-0&amp;since=2026-11-02&amp;until=2026-11-03&page=2" in html
    assert 'value="train-0"' in html and 'value="2026-11-02"' in html


def test_the_job_page_list_explains_a_malformed_filter_instead_of_failing(team, member_client):
    make_jobs(team, 2)
    response = member_client.get(reverse("jobs:list"), {"since": "not-a-day"})
    assert response.status_code == 200 and response.context["page"].paginator.count == 2
    assert "filters ignored" in response.content.decode()


def test_the_job_page_list_refuses_the_calendars_last_day_as_a_filter_instead_of_failing(team, member_client):
    make_jobs(team, 2)
    response = member_client.get(reverse("jobs:list"), {"until": "9999-12-31"})
    assert response.status_code == 200 and response.context["page"].paginator.count == 2
    assert "Pick a day before 9999-12-31." in response.content.decode()


def test_the_queue_lists_each_of_an_arrays_tasks_submitted_together_on_exactly_one_page(team, member_client):
    # An array's tasks share submitted_at, and the scheduler has not ranked them yet.
    Job.objects.bulk_create(
        JobFactory.build(team=team, state="queued", submitted_at=T0, priority=None, name=f"t-{i}")
        for i in range(300)
    )
    seen = []
    for n in range(1, 7):  # 50 a page
        seen += [job.id for job in member_client.get(reverse("jobs:queue"), {"page": n}).context["page"]]
    assert len(seen) == len(set(seen)) == 300


def test_the_job_page_list_runs_the_same_queries_for_3_jobs_as_for_60(
    team, member_client, django_assert_num_queries
):
    make_jobs(team, 3)
    with CaptureQueriesContext(connection) as few:
        member_client.get(reverse("jobs:list"), {"name": "train"})
    make_jobs(team, 57)
    with django_assert_num_queries(len(few.captured_queries)):
        member_client.get(reverse("jobs:list"), {"name": "train"})


def test_past_the_count_cap_lists_say_so_instead_of_counting_every_row(api, team, member_client, monkeypatch):
    monkeypatch.setattr(paging, "COUNT_CAP", 4)
    make_jobs(team, 6)
    body = api.get("/api/v1/jobs", {"limit": 2, "offset": 4}).json()
    assert (body["count"], body["count_capped"]) == (4, True)
    assert [j["name"] for j in body["items"]] == ["train-001", "train-000"]  # paging still reaches every row
    narrowed = api.get("/api/v1/jobs", {"since": (T0 + timedelta(hours=3)).isoformat()}).json()
    assert (narrowed["count"], narrowed["count_capped"]) == (3, False)
    monkeypatch.setattr(views, "PAGE_SIZE", 2)
    html = member_client.get(reverse("jobs:list")).content.decode()
    assert "Page 1 of 2+" in html and "filter to reach older ones" in html


def test_times_with_any_offset_are_read_in_utc(api, team):
    make_jobs(team, 3)
    assert api.get("/api/v1/jobs", {"since": "2026-11-01T02:30:00+01:00"}).json()["count"] == 1
    assert api.get("/api/v1/jobs", {"since": "0309-04-06T07:49:56-17:50"}).json()["count"] == 3
    assert api.get("/api/v1/jobs", {"until": "0001-01-01T00:00:00+05:00"}).status_code == 422


@pytest.mark.parametrize("slug", ["audio", "visoin"])
def test_a_team_filter_naming_no_team_of_the_member_is_a_404_not_an_empty_list(api, team, other_team, slug):
    """Reproduction: `e31 ls --team demoo` (a typo) and `e31 queue --team vision` (not a member) listed nothing and
    exited 0, as if the team had no jobs; the ledger and the secrets answer "No such team"."""
    make_jobs(team, 1)
    response = api.get("/api/v1/jobs", {"team": slug})
    assert response.status_code == 404 and response.json()["detail"] == "No such team"
    assert api.get("/api/v1/jobs", {"team": "vision"}).json()["count"] == 1


def test_a_job_names_its_team_by_the_slug_every_input_takes_too(api, team):
    """The job's "team" was the display name ("Vision Lab"), which no --team, team= or URL accepts."""
    team.name = "Vision Lab"
    team.save()
    make_jobs(team, 1)
    listed = api.get("/api/v1/jobs").json()["items"][0]
    assert (listed["team"], listed["team_slug"]) == ("Vision Lab", "vision")
    assert api.get("/api/v1/jobs", {"team": listed["team_slug"]}).json()["count"] == 1


def test_a_mistyped_filter_is_a_422_naming_it_not_every_job(api, team):
    """Reproduction: `GET /api/v1/jobs?stat=running` listed every job, as if filtered: a script cancelling what it
    lists would have cancelled them all."""
    make_jobs(team, 2)
    response = api.get("/api/v1/jobs", {"stat": "running"})
    assert response.status_code == 422
    assert response.json()["detail"] == "Unknown parameter stat (did you mean state?)."
    assert api.get("/api/v1/jobs", {"state": "queued", "limit": 5, "offset": 0}).status_code == 200


def test_a_401_says_how_to_authenticate(client):
    response = client.get("/api/v1/jobs")
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")
    refused = client.get("/api/v1/jobs", HTTP_AUTHORIZATION="Bearer e31_not-a-token")
    assert refused.status_code == 401 and 'error="invalid_token"' in refused["WWW-Authenticate"]
