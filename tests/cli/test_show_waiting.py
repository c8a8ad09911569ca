"""What `e31 show` says of a job waiting to start: its reason, and its estimated start in a named zone."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import scheduler
from jobs.models import Job
from tests.cli.inprocess import e31
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_the_cli_says_a_job_that_can_never_start_will_never_start(monkeypatch, team, member_token, pool):
    """A 64-GPU job on an 8-GPU pool: `e31 show` printed an empty "(estimated start )"."""
    job = JobFactory(team=team, gpus=64, submitted_at=timezone.now() - timedelta(minutes=5))
    scheduler.run_pass(now=timezone.now())
    job = Job.objects.get(id=job.id)
    assert job.estimated_start is None and job.pending_reason.startswith("larger than the pool")
    code, out, err = e31(monkeypatch, member_token, "show", str(job.id))
    assert code == 0, err
    shown = " ".join(out.split())  # rich wraps long lines
    assert "waiting: larger than the pool" in shown, out
    assert "(estimated start )" not in shown, out


def test_the_cli_names_the_timezone_of_an_estimated_start(monkeypatch, team, member_token, pool):
    """`e31 show` printed a bare "2026-05-04 14:20:00", in no named zone (the web pages say UTC); the tables name
    theirs in the column's head."""
    now = timezone.now()
    JobFactory(team=team, gpus=4, hours=2.0, submitted_at=now - timedelta(hours=1))
    JobFactory(team=team, gpus=4, hours=2.0, submitted_at=now - timedelta(hours=1))
    job = JobFactory(team=team, gpus=4, hours=1.0, submitted_at=now - timedelta(minutes=5))
    scheduler.run_pass(now=now)
    job.refresh_from_db()
    assert job.state == "queued" and job.estimated_start is not None
    code, out, err = e31(monkeypatch, member_token, "show", str(job.id))
    assert code == 0, err
    shown = " ".join(out.split())
    start = shown.split("(estimated start ", 1)[1].split(")", 1)[0]
    assert "UTC" in start or "+00" in start or start.endswith("Z"), shown


def test_e31_show_names_the_array_a_task_run_again_counts_against(
    monkeypatch, team, member, operator, member_token
):
    from jobs.models import JobArray
    from operations import services as operations

    now = timezone.now()
    array = JobArray.objects.create(team=team, name="s", spec="0-3%2", size=4, max_running=2, first_index=0,
                                    submitted_at=now)  # fmt: skip
    task = JobFactory(team=team, array=array, array_index=3, state="ended", end_reason="failed")
    copy = operations.requeue_job(job_id=task.id, actor=operator, now=now)
    code, out, err = e31(monkeypatch, member_token, "show", str(copy.id))
    assert code == 0, err
    assert (
        f"task 3, run again from array {array.id}: counted among its at most 2 running at once"
        in " ".join(out.split())
    )


def test_e31_queue_says_when_it_does_not_show_every_waiting_job(monkeypatch, team, member_token):
    """It read the newest 1,000 waiting jobs, sorted them by estimated start and said nothing of the rest: the
    oldest, often the soonest to start, were the ones left out."""
    from e31cli import main

    monkeypatch.setattr(main, "QUEUE_ROWS", 3)
    JobFactory.create_batch(4, team=team, state="queued")
    code, _, err = e31(monkeypatch, member_token, "queue")
    assert code == 0, err
    assert "Only the newest 3 waiting jobs are shown" in err
    monkeypatch.setattr(main, "QUEUE_ROWS", 4)
    code, _, err = e31(monkeypatch, member_token, "queue")
    assert code == 0 and "Only the newest" not in err
