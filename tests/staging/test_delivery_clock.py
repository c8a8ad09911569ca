"""A node's deliveries are dated, and their leases judged, by the platform's time as the agent corrects it."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import clock, delivery, delivery_threads, rental
from jobs.lifecycle import EndReason, State
from jobs.models import Allocation, Job, OutputTransfer
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_dead_delivery_lease_is_taken_over_on_a_node_whose_clock_lags(pool, team, monkeypatch):
    """delivery_threads passed the node's raw clock where every other date the agent writes is corrected: on a node
    2 hours behind, a part whose delivery task died (its agent restarted) was not taken over by the re-rung task
    for 2 hours, and the jobs waiting for its outputs waited with it."""
    true_now = timezone.now()
    job = JobFactory(team=team, state=State.QUEUED)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=true_now - timedelta(hours=1))
    part = Allocation.objects.get(job=job)
    ended = true_now - timedelta(minutes=10)
    Allocation.objects.filter(id=part.id).update(
        started_at=true_now - timedelta(minutes=59), finished_at=ended, sealed_at=ended, released_at=ended
    )
    Job.objects.filter(id=job.id).update(
        state=State.RELEASED, end_reason=EndReason.SUCCEEDED, delivery_state="delivering", sealed_files=1
    )
    # The task delivering it beat last 5 minutes ago (platform time), then died with its agent.
    OutputTransfer.objects.create(
        allocation=part, job=job, state="delivering", token="dead", updated_at=true_now - timedelta(minutes=5)
    )
    lag = timedelta(hours=2)
    monkeypatch.setattr(timezone, "now", lambda: true_now - lag)  # the node's own clock
    monkeypatch.setattr(clock, "_reading", (true_now, time.monotonic()))  # as its agent read the database's
    took = []
    monkeypatch.setattr(
        delivery, "_wait_for_slot", lambda transfer, node_id, watch: took.append(transfer.token)
    )
    for step in ("_deliver", "_deliver_log", "_delivered"):
        monkeypatch.setattr(delivery, step, lambda *args, **kwargs: None)

    delivery_threads._deliver(part.id)  # the reconciler's ring, on the restarted agent

    assert took, "a lease silent for 5 minutes was not taken over"
    assert took != ["dead"]
