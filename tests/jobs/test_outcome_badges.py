"""A job's badge says how it ended, in words, in a colour that matches: never a green "released"
for a job that failed or was cancelled."""

import pytest
from django.template import Context, Template
from django.urls import reverse
from django.utils import timezone

from jobs import presenters, services
from jobs.models import Job
from tests.factories import JobFactory


@pytest.mark.parametrize(
    ("fields", "words", "tone"),
    [
        ({"state": "released", "end_reason": "succeeded", "exit_code": 0}, "succeeded", "ok"),
        ({"state": "released", "end_reason": "failed", "exit_code": 3}, "failed exit 3", "bad"),
        ({"state": "released", "end_reason": "failed"}, "failed", "bad"),
        ({"state": "released", "end_reason": "timed_out", "hours": 0.5}, "timed out after 0.5 h", "warn"),
        ({"state": "released", "end_reason": "timed_out", "hours": 2.0}, "timed out after 2 h", "warn"),
        ({"state": "released", "end_reason": "out_of_memory"}, "out of memory", "bad"),
        ({"state": "released", "end_reason": "node_lost"}, "node lost", "bad"),
        ({"state": "ended", "end_reason": "staging_failed"}, "staging failed", "bad"),
        ({"state": "ended", "end_reason": "cancelled"}, "cancelled", "muted"),
        ({"state": "running"}, "running", "state-running"),
        ({"state": "running", "cancel_requested_at": timezone.now()}, "cancelling", "state-running"),
    ],
)
def test_the_outcome_is_told_in_words_with_a_matching_colour(fields, words, tone):
    assert presenters.outcome(Job(**{"hours": 1.0, **fields})) == (words, tone)


def test_a_cancelled_job_names_who_cancelled_it():
    job = Job(state="ended", end_reason="cancelled", hours=1.0)
    job.cancelled_by = "alice"
    assert presenters.outcome(job) == ("cancelled by alice", "muted")


@pytest.mark.django_db
def test_the_badge_tag_draws_the_outcome_with_its_colour(team):
    job = JobFactory(team=team, state="released", end_reason="failed", exit_code=3)
    html = Template("{% load e31 %}{% job_badge job with_id=True %}").render(Context({"job": job}))
    assert html == f'<span class="badge bad" id="job-{job.id}-badge">failed exit 3</span>'


@pytest.mark.django_db
def test_the_job_list_and_page_say_who_cancelled_a_job(team, member, member_client):
    job = JobFactory(team=team, state="queued")
    services.cancel_job(job_id=job.id, user=member, now=timezone.now())
    listing = member_client.get(reverse("jobs:list")).content.decode()
    page = member_client.get(reverse("jobs:detail", args=[job.id])).content.decode()
    assert ">cancelled by alice</span>" in listing and ">cancelled by alice</span>" in page
    assert 'class="badge state-ended"' not in listing + page


@pytest.mark.django_db
def test_the_job_page_writes_every_end_reason_in_words_not_as_an_identifier(team, member_client):
    job = JobFactory(team=team, state="released", end_reason="timed_out", hours=0.5)
    page = member_client.get(reverse("jobs:detail", args=[job.id])).content.decode()
    assert "<strong>Ended:</strong> timed out" in page
    assert not [word for word in ("timed_out", "out_of_memory") if f">{word}" in page or f" {word}" in page]
