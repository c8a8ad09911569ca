"""Facts that must not outlive their moment: a waiting reason on an ended job, one attempt's time
counted in another's step."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import QuerySet
from django.utils import timezone

from jobs import planning, presenters, rental, scheduler
from jobs.lifecycle import EndReason, State
from jobs.models import Job, JobEvent
from jobs.scheduling import types
from jobs.transitions import transition
from tests.factories import JobFactory, NodeFactory

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


@pytest.mark.django_db
def test_a_job_that_ends_no_longer_says_why_it_is_waiting_nor_when_it_would_start(
    team, member_client, member_token
):
    job = JobFactory(team=team, state="staging", pending_reason="waiting for its data to finish staging",
                     estimated_start=timezone.now())  # fmt: skip
    transition(job_id=job.id, source=State.STAGING, target=State.ENDED, now=timezone.now(),
               end_reason=EndReason.STAGING_FAILED, reason="corpus.bin: no such file")  # fmt: skip
    got = member_client.get(f"/api/v1/jobs/{job.id}", HTTP_AUTHORIZATION=f"Bearer {member_token}").json()
    assert (got["state"], got["pending_reason"], got["estimated_start"]) == ("ended", "", None)


@pytest.mark.django_db
def test_a_scheduler_pass_never_writes_a_waiting_reason_onto_a_job_that_ended_meanwhile(team, monkeypatch):
    job = JobFactory(team=team, state="queued")
    estimate = types.Estimate(job_id=job.id, start_at=None, reason_code="data", reason="waiting for its data")
    plan = types.Plan(starts=[], preemptions=[], reservations=[], estimates={job.id: estimate}, priority={})
    original = QuerySet.bulk_update

    def ends_first(queryset, *args, **kwargs):  # the job ends between the pass's read and its write
        Job.objects.filter(id=job.id).update(state=State.ENDED, end_reason=EndReason.CANCELLED)
        return original(queryset, *args, **kwargs)

    monkeypatch.setattr(QuerySet, "bulk_update", ends_first)
    planning.store_estimates(plan, now=timezone.now())
    assert Job.objects.get(id=job.id).pending_reason == ""


def _events(*moves: tuple[int, str, str]) -> list[JobEvent]:
    return [JobEvent(from_state=a, to_state=b, at=T0 + timedelta(seconds=s)) for s, a, b in moves]


def test_after_a_requeue_the_stage_step_took_only_its_own_time():
    events = _events(
        (0, "", "submitted"), (1, "submitted", "staging"), (4, "staging", "queued"),
        (5, "queued", "rented"), (6, "rented", "running"), (30, "running", "queued"),
        (32, "queued", "rented"), (33, "rented", "running"),
    )  # fmt: skip
    job = Job(state="running", attempt=2)
    steps = {s.label: s for s in presenters.timeline(job, events, now=T0 + timedelta(seconds=40))}
    assert steps["Submit"].took == timedelta(seconds=1)
    assert steps["Stage"].took == timedelta(seconds=3)
    assert steps["Queue"].began_at == T0 + timedelta(seconds=30) and steps["Queue"].took == timedelta(
        seconds=2
    )
    assert steps["Run"].took == timedelta(seconds=7)


@pytest.mark.django_db
def test_a_job_behind_one_whose_process_started_late_is_not_told_it_starts_now():
    """A team's job waits for the only GPU, held by a 1-hour job that was rented 65 minutes ago but whose
    process started only 55 minutes ago (the node picked its part up late). The agent stops that job at
    its process start + 1 h, 5 minutes from now, so the GPU is busy until then. The waiting team is told
    its job starts now: the snapshot plans the running job's end from its rent, not from the deadline the
    agent enforces, and the reservation lands in the past."""
    now = timezone.now()
    NodeFactory(name="gpu-01", gpus=1)
    running = JobFactory(gpus=1, hours=1.0)
    assert rental.rent_job(job_id=running.id, gpus_by_node={"gpu-01": (0,)}, now=now - timedelta(minutes=65))
    allocation = running.allocations.get()
    assert rental.start_allocation(allocation_id=allocation.id, now=now - timedelta(minutes=55))
    assert rental.stop_reason(allocation_id=allocation.id, now=now) == ""  # the agent lets it run on
    waiting = JobFactory(gpus=1, hours=1.0)

    scheduler.run_pass(now=now)

    waiting.refresh_from_db()
    assert waiting.state == "queued"  # the GPU is held: it cannot start
    assert waiting.estimated_start is not None
    assert waiting.estimated_start >= now + timedelta(minutes=5) - timedelta(seconds=1), (
        waiting.estimated_start - now,
        waiting.pending_reason,
    )
