"""Two beat processes at once, and accrual racing a RELEASE or a budget projection: separate connections, real commits."""

import threading
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection, transaction

from jobs import rental
from jobs.models import Job
from metering import selectors, services
from metering.models import MeterEntry
from metering.periods import floor_hour, hour_slices, micros
from tests.metering.conftest import T0, metered_micros, release, rent

pytestmark = pytest.mark.django_db(transaction=True)


def at_once(*calls: Callable[[], object]) -> list[BaseException]:
    """Runs each call on its own thread (so its own database connection), released by one barrier."""
    barrier = threading.Barrier(len(calls))
    errors: list[BaseException] = []

    def run(call: Callable[[], object]) -> None:
        try:
            barrier.wait()
            call()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return errors


def test_two_accruals_at_once_write_each_hour_exactly_once(team, node):
    allocations = [
        rent(team=team, node=node, at=T0 + timedelta(minutes=7 * i), name=f"job-{i}") for i in range(6)
    ]
    now = T0 + timedelta(days=2, minutes=3)
    for _ in range(3):
        assert at_once(lambda: services.accrue_meter(now=now), lambda: services.accrue_meter(now=now)) == []
    for allocation in allocations:
        expected = list(hour_slices(allocation.rented_at, floor_hour(now)))
        rows = MeterEntry.objects.filter(allocation=allocation).order_by("period_start")
        assert [(r.period_start, r.period_end) for r in rows] == expected
    assert services.find_violations(now=now) == []


def test_accrual_racing_a_release_keeps_the_sum_exact(team, node):
    allocations = [
        rent(team=team, node=node, at=T0 + timedelta(seconds=i), name=f"race-{i}") for i in range(4)
    ]
    released_at = T0 + timedelta(hours=26, minutes=59, seconds=59)
    later = released_at + timedelta(minutes=5)
    errors = at_once(
        lambda: services.accrue_meter(now=later),
        *[lambda a=a: release(a, at=released_at) for a in allocations[:2]],
        lambda: services.accrue_meter(now=later),
    )
    assert errors == []
    for allocation in allocations[2:]:
        release(allocation, at=later)
    assert services.find_violations(now=later + timedelta(hours=1)) == []
    for allocation in allocations:
        allocation.refresh_from_db()
        assert metered_micros(allocation) == micros(allocation.released_at - allocation.rented_at)


def test_a_ledger_writer_waits_for_its_teams_lock(team, node):
    # Writers of one team's summary rows take turns: an accrual waits while another writer holds the lock.
    rent(team=team, node=node, at=T0)
    finished = threading.Event()
    writer = threading.Thread(
        target=lambda: (
            services.accrue_meter(now=T0 + timedelta(hours=3)),
            finished.set(),
            connection.close(),
        )
    )
    with transaction.atomic(), connection.cursor() as cursor:
        # The key of common.ledger_locks.TEAM_LEDGER_LOCK, spelled out: the lock is the contract, not the name.
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [0x0E31_1ED6, team.id])
        writer.start()
        assert not finished.wait(timeout=1.0)
    writer.join(timeout=30)
    assert finished.is_set()
    assert MeterEntry.objects.filter(team_id=team.id).count() == 3  # 09:20, 10:00, 11:00


@pytest.mark.parametrize("held", [0, 1])  # whichever of the two the node's loss comes to second
def test_a_node_lost_while_one_of_its_jobs_is_being_released_deadlocks_neither(team, node, held):
    # Found by two beats and a release at once: declaring a node down releases its jobs in one transaction.
    # Releasing the first took its team's ledger lock; waiting then for the second job's row, held by a
    # single RELEASE that itself waited for that ledger lock, made a cycle PostgreSQL broke with an error.
    pair = [rent(team=team, node=node, at=T0, gpus=1, name=f"lost-{i}") for i in range(2)]
    second = pair[held]
    second_locked, errors = threading.Event(), []

    def release_the_second_alone() -> None:
        try:
            with transaction.atomic():
                Job.objects.select_for_update().get(id=second.job_id)  # as RELEASE holds it, first
                second_locked.set()
                time.sleep(1.0)  # the node's loss meanwhile releases the first job and comes for this one
                release(second, at=T0 + timedelta(hours=1))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    alone = threading.Thread(target=release_the_second_alone)
    alone.start()
    assert second_locked.wait(timeout=10)
    try:
        with transaction.atomic():
            rental.lose_node_allocations(node=node, now=T0 + timedelta(hours=2), detail="silent")
    except BaseException as exc:
        errors.append(exc)
    alone.join(timeout=60)
    assert errors == []
    for allocation in pair:
        allocation.refresh_from_db()
        assert metered_micros(allocation) == micros(allocation.released_at - allocation.rented_at)


def test_the_budget_projection_does_not_lose_hours_that_accrual_closes_while_it_reads(
    team, node, monkeypatch
):
    """A job has held 4 GPUs since 09:30 UTC and the ledger is closed up to 10:00 (accrual was
    behind). At 12:30 a member opens the ledger page just as beat's accrual closes 10:00-12:00,
    between the projection's read of the ledger and its read of the held allocations. Both reads
    come from one snapshot, so the team is shown 12 GPU-hours, not the 4 a torn read would give."""
    now = T0.replace(month=5, day=20, hour=12, minute=30, second=0, microsecond=0)
    rent(team=team, node=node, at=now - timedelta(hours=3), gpus=4, name="running")
    services.accrue_meter(now=now.replace(hour=10, minute=5))  # closes 09:30-10:00
    read_running = selectors._held_micros

    def running_after_a_concurrent_accrual(**kwargs) -> tuple[int, int]:
        assert at_once(lambda: services.accrue_meter(now=now)) == []
        return read_running(**kwargs)

    monkeypatch.setattr(selectors, "_held_micros", running_after_a_concurrent_accrual)
    p = selectors.projection(team=team, extra_gpu_hours=0.0, now=now)
    assert MeterEntry.objects.filter(period_end=now.replace(minute=0)).exists()  # the accrual did commit
    assert p.used_gpu_hours + p.running_gpu_hours == pytest.approx(12.0)


def test_a_submission_weighing_its_budget_does_not_lose_hours_that_accrual_closes_while_it_reads(
    team, node, monkeypatch
):
    """The same reads inside a submission's own transaction, which is not one snapshot: the team's ledger
    lock holds the accrual back until both are done (a second later it commits), so 12 GPU-hours, not 4."""
    now = T0.replace(month=5, day=20, hour=12, minute=30, second=0, microsecond=0)
    rent(team=team, node=node, at=now - timedelta(hours=3), gpus=4, name="running")
    services.accrue_meter(now=now.replace(hour=10, minute=5))  # closes 09:30-10:00
    read_running, accruals = selectors._held_micros, []

    def accrue() -> None:
        try:
            services.accrue_meter(now=now)
        finally:
            connection.close()

    def running_while_an_accrual_tries_to_commit(**kwargs) -> tuple[int, int]:
        accruals.append(threading.Thread(target=accrue))
        accruals[0].start()
        accruals[0].join(timeout=1.0)  # it has committed by now, unless something holds it back
        return read_running(**kwargs)

    monkeypatch.setattr(selectors, "_held_micros", running_while_an_accrual_tries_to_commit)
    with transaction.atomic():
        p = selectors.projection(team=team, extra_gpu_hours=0.0, now=now)
    accruals[0].join(timeout=30)
    assert MeterEntry.objects.filter(
        period_end=now.replace(minute=0)
    ).exists()  # the accrual did commit, after
    assert p.used_gpu_hours + p.running_gpu_hours == pytest.approx(12.0)
