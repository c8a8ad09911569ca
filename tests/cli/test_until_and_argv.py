"""`e31` says what the pages say: the same jobs for the same dates, the same command line."""

from datetime import UTC, datetime

import pytest

from tests.cli.inprocess import e31
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_ls_until_a_date_takes_in_that_days_jobs_as_the_jobs_page_does(
    monkeypatch, team, member_token, member_client
):
    """The jobs page's "to 2026-12-07" listed that day's 17 jobs; `e31 ls --until 2026-12-07` listed none."""
    that_day = JobFactory(team=team, name="that-day", submitted_at=datetime(2026, 12, 7, 21, 5, tzinfo=UTC))
    JobFactory(team=team, name="next-day", submitted_at=datetime(2026, 12, 8, 0, 0, tzinfo=UTC))
    page = member_client.get("/jobs/?until=2026-12-07").content.decode()
    assert "that-day" in page and "next-day" not in page
    code, out, err = e31(monkeypatch, member_token, "ls", "--until", "2026-12-07")
    assert code == 0, err
    assert [line.split()[1] for line in out.splitlines()[1:]] == [that_day.name]


def test_show_quotes_each_argument_as_the_job_page_does(monkeypatch, team, member_token):
    """`e31 show` printed `argv: sh -c echo start; sleep 600`: one argument or four? The job page quotes it."""
    job = JobFactory(team=team, argv=["sh", "-c", "echo start; sleep 600"])
    code, out, err = e31(monkeypatch, member_token, "show", str(job.id))
    assert code == 0, err
    assert "  argv: sh -c 'echo start; sleep 600'" in out.splitlines(), out
