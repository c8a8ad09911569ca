"""RENT and RELEASE on PostgreSQL: the database refuses a GPU held twice; every release closes the meter."""

import itertools
import threading
import time
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from jobs import nodes, rental, scheduler, services, transitions
from jobs.lifecycle import REQUEUED, EndReason
from jobs.models import Allocation, GpuHold, ImagePull, Job, JobEvent
from metering import services as metering
from tests.factories import JobFactory, MembershipFactory, NodeFactory

pytestmark = pytest.mark.django_db


def test_the_database_refuses_a_gpu_in_two_active_allocations(pool):
    a, b = JobFactory(), JobFactory()
    assert rental.rent_job(job_id=a.id, gpus_by_node={"gpu-01": (0, 1)}, now=timezone.now())
    allocation = Allocation.objects.create(
        job=b, attempt=1, node=pool[0], gpu_indices=[1], rented_at=timezone.now()
    )
    with pytest.raises(IntegrityError, match="gpu_held_at_most_once"), transaction.atomic():
        GpuHold.objects.create(allocation=allocation, node=pool[0], gpu_index=1)


def test_rent_refuses_a_taken_gpu_and_leaves_the_job_queued(pool):
    a, b = JobFactory(), JobFactory()
    assert rental.rent_job(job_id=a.id, gpus_by_node={"gpu-01": (0,)}, now=timezone.now())
    assert not rental.rent_job(job_id=b.id, gpus_by_node={"gpu-01": (0,)}, now=timezone.now())
    b.refresh_from_db()
    assert b.state == "queued" and not b.allocations.exists()


def test_rent_refuses_a_drained_node(pool):
    nodes.set_node_state(name="gpu-01", target="draining", now=timezone.now(), actor="olga")
    assert not rental.rent_job(job_id=JobFactory().id, gpus_by_node={"gpu-01": (0,)}, now=timezone.now())


def test_release_frees_the_gpus_closes_the_meter_exactly_and_records_the_reason(pool):
    job = JobFactory()
    rented = timezone.now() - timedelta(hours=2, minutes=7, microseconds=3)
    rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0, 1, 2)}, now=rented)
    allocation = job.allocations.get()
    rental.start_allocation(allocation_id=allocation.id, now=rented)
    released = timezone.now()
    assert rental.release_job(job_id=job.id, end_reason=EndReason.CANCELLED, now=released, actor="test")
    job.refresh_from_db()
    allocation.refresh_from_db()
    assert (job.state, job.end_reason) == ("released", "cancelled")
    assert allocation.released_at == released and not GpuHold.objects.filter(active=True).exists()
    from metering.models import MeterEntry

    held_us = (released - rented) // timedelta(microseconds=1)
    rows = list(MeterEntry.objects.filter(allocation=allocation).order_by("period_start"))
    assert sum(r.microseconds for r in rows) == held_us
    assert rows[0].period_start == rented and rows[-1].period_end == released
    assert all(a.period_end == b.period_start for a, b in itertools.pairwise(rows))  # no gap, no overlap
    assert {r.gpus for r in rows} == {3}
    assert not rental.release_job(job_id=job.id, end_reason=EndReason.FAILED, now=released, actor="again")


def _running(job, node: str, now) -> None:
    """Rented on ``node`` and started there (a part lost before its start sends its job back, see
    test_lost_before_start)."""
    assert rental.rent_job(job_id=job.id, gpus_by_node={node: (0,)}, now=now)
    assert rental.start_allocation(allocation_id=job.allocations.get(released_at__isnull=True).id, now=now)


def test_a_lost_node_requeues_a_job_that_allows_it_and_never_runs_two_attempts(pool):
    job = JobFactory(requeue=True)
    now = timezone.now()
    _running(job, "gpu-01", now)
    rental.lose_node_allocations(node=pool[0], now=now + timedelta(seconds=5), detail="silent")
    job.refresh_from_db()
    assert job.state == "queued" and job.attempt == 1
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    assert job.events.last().reason.startswith(REQUEUED)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-02": (0,)}, now=now + timedelta(seconds=6))
    job.refresh_from_db()
    assert job.attempt == 2 and Allocation.objects.filter(job=job, released_at__isnull=True).count() == 1


def test_a_lost_node_ends_a_job_without_requeue_as_node_lost(pool):
    job = JobFactory(requeue=False)
    now = timezone.now()
    _running(job, "gpu-01", now)
    rental.lose_node_allocations(node=pool[0], now=now, detail="silent")
    job.refresh_from_db()
    assert (job.state, job.end_reason) == ("released", "node_lost")


def test_requeue_stops_after_the_attempt_limit(pool, settings):
    settings.E31_MAX_ATTEMPTS = 2
    job = JobFactory(requeue=True)
    for attempt in (1, 2):
        now = timezone.now()
        _running(job, "gpu-01", now)
        rental.lose_node_allocations(node=pool[0], now=now, detail=f"loss {attempt}")
    job.refresh_from_db()
    assert (job.state, job.end_reason, job.attempt) == ("released", "node_lost", 2)


def test_the_reaper_declares_a_silent_node_down_and_records_its_last_heartbeat(pool, settings):
    settings.E31_NODE_TIMEOUT_S = 10
    job = JobFactory()
    now = timezone.now()
    rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=now)
    pool[0].__class__.objects.filter(name="gpu-01").update(last_heartbeat=now - timedelta(seconds=30))
    assert nodes.reap_silent_nodes(now=now) == ["gpu-01"]
    allocation = job.allocations.get()
    assert allocation.released_at == now and allocation.last_heartbeat_at_release == now - timedelta(
        seconds=30
    )
    assert nodes.reap_silent_nodes(now=now) == []  # idempotent


@pytest.mark.django_db(transaction=True)
def test_concurrent_scheduler_passes_never_double_book(settings):
    """Four passes at once over 12 one-GPU jobs and 8 GPUs: exactly 8 start, each GPU once."""
    for i in range(2):
        NodeFactory(name=f"n{i}", gpus=4)
    team = JobFactory().team
    Job.objects.all().delete()
    for _ in range(12):
        JobFactory(team=team, gpus=1)
    errors = []

    def one_pass():
        try:
            scheduler.run_pass(now=timezone.now())
        except Exception as exc:  # a failure in a thread must fail the test
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=one_pass) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert GpuHold.objects.filter(active=True).count() == 8
    assert Job.objects.filter(state="rented").count() == 8
    held = list(GpuHold.objects.filter(active=True).values_list("node_id", "gpu_index"))
    assert len(held) == len(set(held))


def test_cancelling_a_rented_job_whose_process_has_not_started_releases_at_once(pool, member):
    job = JobFactory(team=member.memberships.first().team)
    rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=timezone.now())
    from jobs import services

    assert services.cancel_job(job_id=job.id, user=member, now=timezone.now())
    job.refresh_from_db()
    assert (job.state, job.end_reason) == ("released", "cancelled")
    assert not rental.start_allocation(allocation_id=job.allocations.get().id, now=timezone.now())


def test_a_job_sealing_its_outputs_is_not_cancelled_and_its_page_says_so(
    pool, member, member_client, client, member_token
):
    """Its process has ended: the cancel was accepted ("cancelled"), and the job then succeeded anyway, as
    nothing watches a process that is gone."""
    job = JobFactory(team=member.memberships.first().team)
    now = timezone.now()
    rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=now)
    part = job.allocations.get()
    rental.start_allocation(allocation_id=part.id, now=now)
    rental.finish_allocation(allocation_id=part.id, exit_code=0, outcome=EndReason.SUCCEEDED, now=now)
    assert Job.objects.get(id=job.id).state == "output"

    assert not services.cancel_job(job_id=job.id, user=member, now=now)
    assert Job.objects.get(id=job.id).cancel_requested_at is None
    assert "Cancel job" not in member_client.get(f"/jobs/{job.id}/").content.decode()
    answer = client.post(f"/api/v1/jobs/{job.id}/cancel", HTTP_AUTHORIZATION=f"Bearer {member_token}")
    assert answer.status_code == 409 and "sealing its outputs" in answer.json()["detail"]
    rental.seal_allocation(allocation_id=part.id, manifest=[], now=now)
    assert Job.objects.get(id=job.id).end_reason == "succeeded"


def test_a_requeued_job_cancelled_before_its_new_attempt_started_is_released_at_once(pool, member):
    """Its first attempt's process started; that says nothing of the second's, which nothing would stop."""
    job = JobFactory(team=member.memberships.first().team, requeue=True)
    now = timezone.now()
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=now)
    assert rental.start_allocation(allocation_id=job.allocations.get().id, now=now)
    rental.lose_node_allocations(node=pool[0], now=now + timedelta(seconds=5), detail="silent")
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-02": (0,)}, now=now + timedelta(seconds=10))

    assert services.cancel_job(job_id=job.id, user=member, now=now + timedelta(seconds=11))
    job.refresh_from_db()
    assert (job.state, job.end_reason, job.attempt) == ("released", "cancelled", 2)
    assert not GpuHold.objects.filter(allocation__job=job, active=True).exists()


def test_a_cancel_whose_clock_was_read_before_a_rent_committed_releases_at_the_rent(pool, member):
    """The API reads ``now`` before it waits for the job's lock; the scheduler may rent meanwhile.

    Seen in the embedded console's cancel burst: the release before the rent broke the
    allocation_released_after_rented constraint and the cancel answered 500.
    """
    job = JobFactory(team=member.memberships.first().team)
    cancel_clock = timezone.now()
    rented_at = cancel_clock + timedelta(milliseconds=40)
    rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=rented_at)

    assert services.cancel_job(job_id=job.id, user=member, now=cancel_clock)
    allocation = job.allocations.get()
    assert allocation.released_at == allocation.rented_at == rented_at
    assert metering.find_violations(now=rented_at + timedelta(seconds=1)) == []


def test_a_preemption_request_is_recorded_in_the_state_the_job_is_in(pool):
    job = JobFactory(preemptible=True)
    now = timezone.now()
    assert rental.rent_job(
        job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=now
    )  # rented, its process not started
    assert rental.request_preemption(job_id=job.id, now=now)
    event = JobEvent.objects.filter(job=job).latest("id")
    assert (event.from_state, event.to_state, event.attempt) == ("rented", "rented", 1)
    assert event.reason == "preemption requested: a reserved job needs these GPUs"


@pytest.mark.django_db(transaction=True)
def test_a_part_starting_as_its_job_is_cancelled_takes_turns_with_the_cancel(monkeypatch):
    """The agent's start holds the part's row while it moves the job; a cancel before the part started holds the
    job's row while it releases the part. Taken in opposite orders they deadlocked, and the database failed one."""
    NodeFactory(name="gpu-01")
    job = JobFactory(gpus=1)
    member = MembershipFactory(team=job.team).user
    now = timezone.now()
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=now)
    allocation = Allocation.objects.get(job=job)
    moving, errors = threading.Event(), []
    real_transition = rental.transition

    def slow_transition(**kwargs):  # the agent's start, between its part's row and its job's
        if threading.current_thread().name == "agent":
            moving.set()
            time.sleep(0.5)
        return real_transition(**kwargs)

    def agent_start():
        try:
            assert rental.start_allocation(allocation_id=allocation.id, now=now)
        except Exception as exc:  # a failure in a thread must fail the test
            errors.append(exc)
        finally:
            connection.close()

    monkeypatch.setattr(rental, "transition", slow_transition)
    agent = threading.Thread(target=agent_start, name="agent")
    agent.start()
    assert moving.wait(5)
    assert services.cancel_job(
        job_id=job.id, user=member, now=now
    )  # waits for the start, then asks its agent
    agent.join()
    assert errors == []
    job.refresh_from_db()
    assert (job.state, job.cancel_requested_at) == ("running", now)


def test_a_requeued_job_is_never_rented_before_its_last_attempt_was_released():
    """A pass reads its clock, then a node loss releases and requeues the job, then the pass's snapshot sees it
    queued: its RENT at the pass's clock would meter the job twice over the gap."""
    NodeFactory(name="n1", gpus=1)
    NodeFactory(name="n2", gpus=1)
    job = JobFactory(requeue=True)
    clock = timezone.now()
    assert rental.rent_job(job_id=job.id, gpus_by_node={"n1": (0,)}, now=clock - timedelta(hours=1))
    first = Allocation.objects.get(job=job)
    assert rental.start_allocation(allocation_id=first.id, now=clock - timedelta(hours=1))
    nodes.set_node_state(name="n1", target="down", now=clock + timedelta(seconds=2), actor="olga")
    scheduler.run_pass(now=clock)
    first.refresh_from_db()
    second = Allocation.objects.get(job=job, attempt=2)
    assert second.rented_at == first.released_at == clock + timedelta(seconds=2)


def test_a_gpu_is_never_rented_before_its_last_holder_released_it():
    NodeFactory(name="solo", gpus=1)
    held, waiting = JobFactory(), JobFactory()
    clock = timezone.now()
    assert rental.rent_job(job_id=held.id, gpus_by_node={"solo": (0,)}, now=clock - timedelta(minutes=30))
    rental.release_job(
        job_id=held.id, end_reason=EndReason.FAILED, now=clock + timedelta(seconds=2), actor="agent"
    )
    scheduler.run_pass(now=clock)
    released = Allocation.objects.get(job=held).released_at
    assert Allocation.objects.get(job=waiting).rented_at == released == clock + timedelta(seconds=2)


def test_a_job_queued_after_the_pass_read_its_clock_is_rented_no_earlier_than_it_was_queued():
    """A pass reads its clock, then the stager queues the job, then the pass's snapshot sees it queued: the job's
    history said QUEUED → RENTED before STAGING → QUEUED, its queue time -0.0 s, and its meter ran from an
    instant its inputs were still being staged."""
    NodeFactory(name="n1", gpus=1)
    clock = timezone.now()
    job = JobFactory(state="staging", state_changed_at=clock - timedelta(minutes=1))
    queued = clock + timedelta(milliseconds=27)
    transitions.transition(
        job_id=job.id, source="staging", target="queued", now=queued, actor="stager", reason="staged"
    )
    scheduler.run_pass(now=clock)
    assert Allocation.objects.get(job=job).rented_at == queued
    order = list(JobEvent.objects.filter(job=job).order_by("at", "id").values_list("to_state", flat=True))
    assert order[-2:] == ["queued", "rented"]


def test_a_job_still_resolving_its_image_does_not_take_the_gpu_a_queued_job_could_use():
    """A job is STAGING: its image reference is being resolved (the pull row has no size yet, 0 bytes).
    A younger queued job could run on the only idle GPU. The pass plans the staging job as ready (its
    ETA from 0 bytes left is "now"), gives it the GPU, the RENT refuses it (not QUEUED), and the queued job
    is left waiting for a reservation an hour away; the staging job's team is told it is "starting now".
    Every pass repeats this for as long as the registry takes to answer."""
    now = timezone.now()
    NodeFactory(name="gpu-01", gpus=1)
    staging = JobFactory(gpus=1, hours=1.0, state="staging", image="registry.example/team/trainer:1",
                         submitted_at=now - timedelta(minutes=10))  # fmt: skip
    ImagePull.objects.create(job=staging, reference=staging.image)  # resolving: bytes not known yet
    queued = JobFactory(team=staging.team, gpus=1, hours=1.0, submitted_at=now - timedelta(minutes=1))

    scheduler.run_pass(now=now)

    staging.refresh_from_db()
    queued.refresh_from_db()
    assert staging.pending_reason != "starting now", (staging.pending_reason, queued.pending_reason)
    assert queued.state == "rented", (queued.state, queued.pending_reason)


def test_a_part_that_started_late_is_held_to_the_jobs_time_limit_not_its_own(pool, team):
    """Rank 1's run message came late and it started 30 minutes after rank 0: at the job's declared hour it is
    stopped, not given another 30 minutes on the meter (rank 0's finished part holds its GPU meanwhile)."""
    job = JobFactory(team=team, gpus=2, hours=1.0)
    start = timezone.now() - timedelta(hours=2)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,), "gpu-02": (0,)}, now=start)
    rank0, rank1 = Allocation.objects.filter(job=job).order_by("rank")
    assert rental.start_allocation(allocation_id=rank0.id, now=start)
    assert rental.start_allocation(allocation_id=rank1.id, now=start + timedelta(minutes=30))
    rental.finish_allocation(
        allocation_id=rank0.id, exit_code=0, outcome=EndReason.SUCCEEDED, now=start + timedelta(minutes=40)
    )
    within, past = start + timedelta(minutes=59), start + timedelta(hours=1, seconds=5)
    assert rental.stop_reason(allocation_id=rank1.id, now=within) == ""
    assert rental.stop_reason(allocation_id=rank1.id, now=past) == EndReason.TIMED_OUT
