"""GET /api/v1/jobs reads only the page it answers: its queries do not grow with the team's jobs."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def listed(client, query: str = "") -> dict:
    response = client.get(f"/api/v1/jobs{query}")
    assert response.status_code == 200
    return response.json()


def test_a_page_fetches_only_its_own_jobs_and_their_events(member_client, team):
    JobFactory.create_batch(60, team=team)
    with CaptureQueriesContext(connection) as queries:
        page = listed(member_client, "?limit=5")
    assert page["count"] == 60 and len(page["items"]) == 5
    jobs = [q["sql"] for q in queries if 'FROM "jobs_job"' in q["sql"] and "COUNT(" not in q["sql"]]
    assert jobs and all("LIMIT 5" in sql for sql in jobs), jobs
    events = [q["sql"] for q in queries if q["sql"].startswith('SELECT "jobs_jobevent"')]  # not a subquery
    [prefetch] = events
    assert len(re.search(r"IN \(([^)]*)\)", prefetch).group(1).split(",")) == 5, prefetch


def test_pages_follow_each_other_newest_first(member_client, team):
    ids = [job.id for job in JobFactory.create_batch(7, team=team)]
    first, second = listed(member_client, "?limit=4"), listed(member_client, "?limit=4&offset=4")
    assert [j["id"] for j in first["items"] + second["items"]] == sorted(ids, reverse=True)


@pytest.mark.parametrize(
    "path",
    ["/api/v1/jobs?offset={}", "/api/v1/jobs/{job}/outputs?offset={}", "/api/v1/jobs/{job}/log?offset={}"],
)
def test_an_offset_past_what_the_database_counts_is_a_422_not_a_500(member_client, team, path):
    job = JobFactory(team=team)
    response = member_client.get(path.format(321377179048972116321953120256, job=job.id))
    assert response.status_code == 422, response.content[:300]
    assert "offset" in response.content.decode()
