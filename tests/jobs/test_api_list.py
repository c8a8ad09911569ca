"""GET /api/v1/jobs reads only the page it answers: its queries do not grow with the team's jobs."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from common import paging
from jobs.api import JOB_PAGE_MAX
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
    jobs = [
        q["sql"]
        for q in queries
        if 'FROM "jobs_job"' in q["sql"] and not q["sql"].startswith("SELECT COUNT(")
    ]
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


@pytest.mark.parametrize("path", ["/api/v1/jobs?{}", "/api/v1/ledger?start=2026-01-01&end=2026-01-31&{}"])
@pytest.mark.parametrize(
    "query", [f"limit={2**63}", f"limit={paging.MAX_PAGE + 1}", f"offset={2**62}&limit={2**62}"]
)
def test_a_limit_past_the_largest_page_is_a_422_naming_it(member_client, team, path, query):
    """A script asks for everything at once (?limit=2**63, or a page that would end past the largest offset):
    the answer is a 422 naming `limit`, never a LIMIT PostgreSQL refuses as a bigint out of range (a 500)."""
    JobFactory(team=team)
    response = member_client.get(path.format(query))
    assert response.status_code == 422, response.content[:300]
    assert [error["field"] for error in response.json()["errors"]] == ["limit"]


def test_the_clis_page_is_the_largest_page_of_jobs(member_client, team):
    """The CLI pages 100 at a time, and a script may ask for as many in one page."""
    JobFactory.create_batch(3, team=team)
    assert len(listed(member_client, f"?limit={JOB_PAGE_MAX}")["items"]) == 3


def test_a_page_of_more_jobs_than_the_largest_is_a_422_naming_it(member_client, team):
    """A job's answer carries its inputs, prerequisites and events: 1,000 jobs of 64 inputs and 64 prerequisites
    in one page took 4.7 s of a web thread, which one token could ask for again and again. The ledger's rows are
    light and keep their larger page."""
    JobFactory(team=team)
    response = member_client.get(f"/api/v1/jobs?limit={JOB_PAGE_MAX + 1}")
    assert response.status_code == 422, response.content[:300]
    [error] = response.json()["errors"]
    assert error["field"] == "limit" and str(JOB_PAGE_MAX) in error["message"], error
