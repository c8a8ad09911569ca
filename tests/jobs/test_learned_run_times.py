"""The live scheduler plans with each team's learned run times; the declared limit stays the deadline."""

import math
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from jobs import selectors, snapshot
from jobs.models import Allocation, Job
from jobs.scheduling import prediction
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db
HOUR = 3600.0


def _finished(team, *, node, declared_hours, ran_hours, count, ago_h=48):
    """``count`` jobs of ``team`` that ran ``ran_hours`` of their ``declared_hours`` and succeeded."""
    now = timezone.now()
    for i in range(count):
        started = now - timedelta(hours=ago_h - i)
        job = JobFactory(team=team, state="released", end_reason="succeeded", hours=declared_hours, attempt=1)
        Allocation.objects.create(
            job=job, attempt=1, node=node, gpu_indices=[0], rented_at=started, started_at=started,
            finished_at=started + timedelta(hours=ran_hours), released_at=started + timedelta(hours=ran_hours),
            end_reason="succeeded",
        )  # fmt: skip


def _running(team, *, node, hours, ran_h):
    rented = timezone.now() - timedelta(hours=ran_h)
    job = JobFactory(team=team, state="running", hours=hours, attempt=1)
    Allocation.objects.create(
        job=job, attempt=1, node=node, gpu_indices=[1], rented_at=rented, started_at=rented
    )
    return job, rented


@pytest.fixture
def node(db):
    return NodeFactory(name="gpu-01", gpus=4)


def test_a_queued_job_is_planned_with_its_teams_learned_run_time(team, node):
    _finished(team, node=node, declared_hours=10, ran_hours=4, count=6)
    queued = JobFactory(team=team, hours=5)
    (pending,) = [p for p in snapshot.take(now=timezone.now()).pending if p.job_id == queued.id]
    assert math.isclose(pending.hours, 2.0)


def test_a_team_without_enough_finished_jobs_is_planned_with_its_declaration(team, node, settings):
    settings.E31_PREDICTION_MIN_JOBS = 5
    _finished(team, node=node, declared_hours=10, ran_hours=4, count=4)
    queued = JobFactory(team=team, hours=5)
    (pending,) = [p for p in snapshot.take(now=timezone.now()).pending if p.job_id == queued.id]
    assert pending.hours == 5


def test_another_teams_history_never_shapes_a_prediction(team, other_team, node):
    _finished(other_team, node=node, declared_hours=10, ran_hours=1, count=8)
    queued = JobFactory(team=team, hours=5)
    (pending,) = [p for p in snapshot.take(now=timezone.now()).pending if p.job_id == queued.id]
    assert pending.hours == 5
    assert selectors.learned_run_times([team.name])[team.name].ratio is None


def test_a_running_job_is_expected_to_end_at_its_prediction(team, node):
    _finished(team, node=node, declared_hours=10, ran_hours=4, count=6)
    job, rented = _running(team, node=node, hours=10, ran_h=1)
    (view,) = [r for r in snapshot.take(now=timezone.now()).running if r.job_id == job.id]
    assert math.isclose(view.expected_end, rented.timestamp() + 4 * HOUR, abs_tol=1)


def test_a_running_job_past_its_prediction_is_extended_at_once_never_past_its_limit(team, node):
    _finished(team, node=node, declared_hours=10, ran_hours=4, count=6)
    job, rented = _running(team, node=node, hours=10, ran_h=5)
    (view,) = [r for r in snapshot.take(now=timezone.now()).running if r.job_id == job.id]
    assert math.isclose(view.expected_end, rented.timestamp() + 8 * HOUR, abs_tol=1)
    late, late_rented = _running(team, node=node, hours=10, ran_h=9)
    (view,) = [r for r in snapshot.take(now=timezone.now()).running if r.job_id == late.id]
    assert math.isclose(view.expected_end, late_rented.timestamp() + 10 * HOUR, abs_tol=1)


def test_the_job_page_says_what_was_predicted_and_why(team, node, member_client):
    _finished(team, node=node, declared_hours=10, ran_hours=4, count=6)
    queued = JobFactory(team=team, hours=5)
    html = member_client.get(reverse("jobs:detail", args=[queued.id])).content.decode()
    assert "Planned run time:</strong> 2 h of its 5 h limit" in html
    assert (
        "your team&#x27;s jobs use 40 % of their declared hours (last 6 finished jobs that succeeded or reached their limit)"
        in html
    )


def test_the_job_page_says_a_cold_start_uses_the_declaration(team, node, member_client):
    queued = JobFactory(team=team, hours=5)
    html = member_client.get(reverse("jobs:detail", args=[queued.id])).content.decode()
    assert "Planned run time:</strong> 5 h of its 5 h limit" in html
    assert (
        "planned with the declared hours: your team has 0 finished jobs that succeeded or reached their limit"
        in html
    )


def test_the_form_says_what_the_draft_would_be_planned_with(team, node, member_client):
    _finished(team, node=node, declared_hours=10, ran_hours=4, count=6)
    response = member_client.post(reverse("jobs:estimate"), {"request.gpus": "1", "request.hours": "5"})
    html = response.content.decode()
    assert "planned as 2 h of its 5 h limit" in html
    assert "40 % of their declared hours" in html


def _released(team, *, node, ran_hours, released):
    """Jobs of ``team`` (declared 10 h) released at each time of ``released`` after running ``ran_hours``, in bulk."""
    jobs = Job.objects.bulk_create(
        JobFactory.build(
            team=team, state="released", end_reason="succeeded", hours=10, attempt=1, state_changed_at=at
        )
        for at in released
    )
    Allocation.objects.bulk_create(
        Allocation(job=job, attempt=1, node=node, gpu_indices=[0], rented_at=at - timedelta(hours=ran_hours),
                   started_at=at - timedelta(hours=ran_hours), finished_at=at, released_at=at, end_reason="succeeded")
        for job, at in zip(jobs, released, strict=True)
    )  # fmt: skip


def test_the_window_is_the_teams_last_releases(team, node):
    now = timezone.now()
    # The jobs created last were released first: the window goes by release, not by creation.
    _released(team, node=node, ran_hours=4, released=[now - timedelta(hours=h) for h in range(1, 51)])
    _released(team, node=node, ran_hours=1, released=[now - timedelta(hours=h) for h in range(100, 120)])
    learned = selectors.learned_run_times([team.name])[team.name]
    assert learned.jobs == prediction.WINDOW
    assert math.isclose(learned.ratio, 0.4)


def test_a_long_history_is_read_from_its_index_a_window_deep(team, other_team, node):
    """A scheduler pass learns every waiting team's run times, and the job page its own team's: with 3,000
    releases each, a plan that joins and sorts a team's whole history reads 3,000 jobs, not the window's 50."""
    now = timezone.now()
    for each in (team, other_team):
        _released(each, node=node, ran_hours=4, released=[now - timedelta(minutes=m) for m in range(1, 3001)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_job")
        cursor.execute("ANALYZE jobs_allocation")
    plan = selectors.finished_runs(team.id).explain(analyze=True)
    read = re.search(
        r"using job_team_ran_to_its_end on jobs_job .*\(actual time=\S+ rows=(\d+) loops=1\)", plan
    )
    assert read is not None, plan
    assert int(read[1]) <= prediction.WINDOW + 1, plan
