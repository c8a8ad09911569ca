"""A pass is asked for once the asking transaction commits.

The doorbell coalesced requests on one flag row, set inside the requesting transaction: a request that finds the
flag already up (set and committed by an earlier request whose pass has not claimed it yet) rings nothing and
relies on that pass. But that pass may claim the flag and read the pool before the request's own transaction
commits: the change the request was for (GPUs freed, a job queued) is then seen by no pass until the safety pass
(E31_SCHEDULER_TICK_S, 30 s), with GPUs idle and a job waiting that fits them."""

import threading
import time

import pytest
from django.db import connection
from django.utils import timezone

from jobs import dispatch, rental, scheduler
from jobs.lifecycle import EndReason, State
from jobs.models import Allocation, Job, SchedulerState
from tests.factories import JobFactory, MembershipFactory, NodeFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _cancel_while_running(part: Allocation, node: str) -> None:
    """The agent's release of a running part, in a thread of its own (its own connection, closed after)."""
    try:
        rental.release_part(allocation_id=part.id, end_reason=EndReason.CANCELLED, now=timezone.now(),
                            actor=f"agent:{node}", detail="cancelled while running")  # fmt: skip
    finally:
        connection.close()


def test_a_release_whose_request_found_the_flag_up_is_seen_by_a_pass(team, monkeypatch):
    rung = []
    monkeypatch.setattr(dispatch, "send_after_commit", lambda name, args, **k: rung.append(name))
    NodeFactory(name="solo", gpus=1)
    now = timezone.now()
    running = JobFactory(team=team, state=State.QUEUED)
    assert rental.rent_job(job_id=running.id, gpus_by_node={"solo": (0,)}, now=now)
    part = Allocation.objects.get(job=running)
    assert rental.start_allocation(allocation_id=part.id, now=now)
    waiting = JobFactory(team=team, state=State.QUEUED)  # fits the GPU once it is free
    SchedulerState.objects.all().delete()
    dispatch.state_row()
    SchedulerState.objects.update(
        pass_requested=True
    )  # an earlier request, committed; its task is on its way
    rung.clear()

    requested, go_on = threading.Event(), threading.Event()
    ring = dispatch.request_scheduler_pass

    def paused_ring():
        ring()
        if threading.current_thread().name == "release":
            requested.set()
            go_on.wait(10)  # the release's transaction is still open

    monkeypatch.setattr(dispatch, "request_scheduler_pass", paused_ring)

    t = threading.Thread(target=_cancel_while_running, args=(part, "solo"), name="release")
    t.start()
    assert requested.wait(10)
    passes = scheduler.run_requested_passes(clock=timezone.now)  # the earlier request's task
    go_on.set()
    t.join(10)

    assert passes == 1
    assert Allocation.objects.get(id=part.id).released_at is not None  # the GPU is free now
    assert Job.objects.get(id=waiting.id).state == State.QUEUED
    more = scheduler.run_requested_passes(clock=timezone.now)  # what the doorbell would run next
    assert rung or more, "the freed GPU waits for the safety pass: no pass was requested after the release"


def test_deleting_an_account_and_a_release_in_its_team_do_not_deadlock(pool, team, member, monkeypatch):
    """Deleting an account cancels its live jobs in one transaction: a waiting job's cancel asked for a pass,
    which locked the pool's one flag row until commit, and a later rented job's cancel then waited for its team's
    ledger lock. A release elsewhere in the team held that lock and waited for the flag row: a deadlock."""
    monkeypatch.setattr(dispatch, "send_after_commit", lambda *a, **k: None)
    leaving = MembershipFactory(team=team, user=UserFactory(username="leaving")).user
    now = timezone.now()
    JobFactory(team=team, submitted_by=leaving, state=State.QUEUED)  # its cancel asks for a pass
    rented = JobFactory(team=team, submitted_by=leaving, state=State.QUEUED)
    assert rental.rent_job(job_id=rented.id, gpus_by_node={"gpu-01": (0,)}, now=now)
    running = JobFactory(team=team, submitted_by=member, state=State.QUEUED)
    assert rental.rent_job(job_id=running.id, gpus_by_node={"gpu-02": (0,)}, now=now)
    part = Allocation.objects.get(job=running)
    assert rental.start_allocation(allocation_id=part.id, now=now)
    SchedulerState.objects.all().delete()
    dispatch.state_row()  # the doorbell's flag down

    release_holds_ledger, delete_rang = threading.Event(), threading.Event()
    ring = dispatch.request_scheduler_pass

    def ordered_ring():
        name = threading.current_thread().name
        if name == "release":  # it holds the job's row and its team's ledger lock by now
            release_holds_ledger.set()
            delete_rang.wait(5)
            time.sleep(0.5)  # the deletion now waits for the team's ledger lock
        ring()
        if name == "delete":
            delete_rang.set()

    monkeypatch.setattr(dispatch, "request_scheduler_pass", ordered_ring)
    outcomes = {}

    def release():
        try:
            _cancel_while_running(part, "gpu-02")
            outcomes["release"] = "ok"
        except BaseException as exc:
            outcomes["release"] = repr(exc)[:160]

    def delete():
        release_holds_ledger.wait(5)
        try:
            leaving.delete()
            outcomes["delete"] = "ok"
        except BaseException as exc:
            outcomes["delete"] = repr(exc)[:160]
        finally:
            connection.close()

    threads = [
        threading.Thread(target=release, name="release"),
        threading.Thread(target=delete, name="delete"),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcomes == {"release": "ok", "delete": "ok"}, outcomes
