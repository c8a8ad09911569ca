"""A team's big cancel never holds up the scheduler's pass, which every team's starts wait for.

Found by review: cancelling a 1,000-task array held all its rows locked for the whole cancel (10.5 s, 31.7 s with
webhooks), and a pass started meanwhile (0.9 s alone) took 9.5 s: it waited, holding the pool's one pass lock, to
write those jobs' estimates. An array is now cancelled in batches, each its own transaction, and the pass writes
the estimates of the waiting jobs no other transaction holds (the others get theirs at the next pass).
"""

import threading
import time

import pytest
from django.db import connection, transaction
from django.utils import timezone

from jobs import planning, services
from jobs.models import Job, JobArray
from jobs.scheduling import types
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _plan(*jobs: Job) -> types.Plan:
    estimates = {
        j.id: types.Estimate(job_id=j.id, start_at=None, reason_code="x", reason="behind others")
        for j in jobs
    }
    return types.Plan(starts=[], preemptions=[], reservations=[], estimates=estimates, priority={})


def _held_by_another_transaction(job: Job, seconds: float) -> threading.Event:
    held = threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Job.objects.select_for_update().filter(id=job.id).get()
                held.set()
                time.sleep(seconds)
        finally:
            connection.close()

    threading.Thread(target=hold, daemon=True).start()
    assert held.wait(5)
    return held


def test_the_pass_writes_the_estimates_it_can_and_never_waits_for_a_held_job(team):
    held, free = JobFactory(team=team, state="queued"), JobFactory(team=team, state="queued")
    _held_by_another_transaction(held, seconds=3)
    began = time.monotonic()
    planning.store_estimates(_plan(held, free), now=timezone.now())
    assert time.monotonic() - began < 1.5
    assert Job.objects.get(id=free.id).pending_reason == "behind others"
    assert Job.objects.get(id=held.id).pending_reason == ""  # the next pass writes it


def test_an_array_is_cancelled_in_batches_each_committed_on_its_own(team, member, monkeypatch):
    array = JobArray.objects.create(
        team=team,
        name="sweep",
        spec=f"0-{services.CANCEL_BATCH + 9}",
        size=services.CANCEL_BATCH + 10,
        first_index=0,
        submitted_at=timezone.now(),
    )
    tasks = [
        JobFactory(team=team, state="queued", array=array, array_index=i)
        for i in range(services.CANCEL_BATCH + 10)
    ]
    original, seen = services.cancel_job, []

    def fails_in_the_second_batch(**kwargs):
        seen.append(kwargs["job_id"])
        if len(seen) == services.CANCEL_BATCH + 5:
            raise RuntimeError("the database went away")
        return original(**kwargs)

    monkeypatch.setattr(services, "cancel_job", fails_in_the_second_batch)
    with pytest.raises(RuntimeError):
        services.cancel_array(array_id=array.id, user=member, now=timezone.now())
    ended = Job.objects.filter(id__in=[t.id for t in tasks], state="ended").count()
    assert ended == services.CANCEL_BATCH  # the first batch stays cancelled; asking again cancels the rest
    monkeypatch.setattr(services, "cancel_job", original)
    assert services.cancel_array(array_id=array.id, user=member, now=timezone.now()) == 10
