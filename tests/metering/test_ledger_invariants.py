"""The ledger's invariants under random RENT/RELEASE instants, repeated accrual, outages and node loss."""

from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings as django_settings
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs import rental
from jobs.lifecycle import EndReason, State
from jobs.models import Allocation, Job, Node
from metering import services
from metering.models import MeterEntry
from metering.periods import HOUR, floor_hour, hour_slices, micros
from tests.metering.conftest import T0, metered_micros, release, rent

pytestmark = pytest.mark.django_db

# Instants near the boundaries that matter: a year, a leap day, a month, a plain hour.
BOUNDARIES = [
    datetime(2024, 1, 1, tzinfo=UTC),
    datetime(2024, 2, 29, tzinfo=UTC),
    datetime(2024, 3, 1, tzinfo=UTC),
    datetime(2024, 12, 31, 23, tzinfo=UTC),
    datetime(2024, 7, 15, 13, tzinfo=UTC),
]
DAY_US = 24 * 3_600_000_000
offsets = st.one_of(st.just(0), st.integers(-3 * DAY_US, 3 * DAY_US), st.integers(-2, 2))
durations = st.one_of(st.just(0), st.integers(1, 4 * DAY_US), st.sampled_from([1, 3_600_000_000, DAY_US]))
fractions = st.lists(st.floats(0, 1), max_size=4)
DB_EXAMPLES = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


class Rollback(Exception):
    pass


def isolated(body) -> None:
    """Runs one hypothesis example in a transaction that is rolled back, so examples never meet."""
    try:
        with transaction.atomic():
            body()
            raise Rollback
    except Rollback:
        pass


def assert_exact(allocation: Allocation, *, now: datetime) -> None:
    allocation.refresh_from_db()
    assert services.find_violations(now=now) == []
    expected = micros((allocation.released_at or floor_hour(now)) - allocation.rented_at)
    if allocation.released_at:
        assert metered_micros(allocation) == expected
        rows = MeterEntry.objects.filter(allocation=allocation).order_by("period_start")
        assert [(r.period_start, r.period_end) for r in rows] == list(
            hour_slices(allocation.rented_at, allocation.released_at)
        )


@DB_EXAMPLES
@given(boundary=st.sampled_from(BOUNDARIES), offset=offsets, duration=durations, accruals=fractions)
def test_released_allocations_sum_exactly_to_release_minus_rent(
    team, node, boundary, offset, duration, accruals
):
    rented_at = boundary + timedelta(microseconds=offset)
    released_at = rented_at + timedelta(microseconds=duration)

    def example() -> None:
        allocation = rent(team=team, node=node, at=rented_at)
        for fraction in sorted(accruals):  # beat runs at random instants while the GPUs are held
            services.accrue_meter(now=rented_at + (released_at - rented_at) * fraction)
        release(allocation, at=released_at)
        services.accrue_meter(now=released_at + timedelta(days=2))  # after RELEASE: adds nothing
        assert_exact(allocation, now=released_at + timedelta(days=2))

    isolated(example)


@DB_EXAMPLES
@given(boundary=st.sampled_from(BOUNDARIES), offset=offsets, repeats=st.integers(2, 4), late=durations)
def test_repeated_accrual_adds_nothing(team, node, boundary, offset, repeats, late):
    rented_at = boundary + timedelta(microseconds=offset)
    now = rented_at + timedelta(microseconds=late)

    def example() -> None:
        allocation = rent(team=team, node=node, at=rented_at)
        services.accrue_meter(now=now)
        first = list(MeterEntry.objects.values_list("id", "period_start", "microseconds"))
        for _ in range(repeats):
            services.accrue_meter(now=now)
        assert list(MeterEntry.objects.values_list("id", "period_start", "microseconds")) == first
        assert services.find_violations(now=now) == []
        assert metered_micros(allocation) == max(
            0, micros(floor_hour(now - timedelta(seconds=60)) - rented_at)
        )

    isolated(example)


def test_an_outage_of_days_is_back_filled_hour_by_hour(team, node):
    allocation = rent(team=team, node=node, at=T0)
    services.accrue_meter(now=T0 + timedelta(minutes=5))
    assert MeterEntry.objects.count() == 0
    back = T0 + timedelta(days=3, minutes=30)  # beat was down for three days
    services.accrue_meter(now=back)
    assert MeterEntry.objects.filter(kind="accrual").count() == len(list(hour_slices(T0, floor_hour(back))))
    assert services.find_violations(now=back) == []
    release(allocation, at=back + timedelta(minutes=7))
    assert_exact(allocation, now=back + timedelta(hours=1))
    assert MeterEntry.objects.filter(kind="final").count() == 1


def test_release_writes_the_hours_accrual_had_not_closed_and_the_final_period(team, node):
    allocation = rent(team=team, node=node, at=T0)
    released_at = T0 + timedelta(hours=5, seconds=1, microseconds=1)
    release(allocation, at=released_at)  # beat never ran
    rows = list(MeterEntry.objects.filter(allocation=allocation).order_by("period_start"))
    assert [r.kind for r in rows] == ["accrual"] * 5 + ["final"]
    assert rows[0].period_start == T0 and rows[-1].period_end == released_at
    assert sum(r.microseconds for r in rows) == micros(released_at - T0)
    assert all(r.gpus == 2 and r.team_id == team.id and r.job_id == allocation.job_id for r in rows)


def test_a_release_on_an_hour_boundary_ends_with_a_full_final_hour(team, node):
    allocation = rent(team=team, node=node, at=datetime(2024, 12, 31, 22, 0, tzinfo=UTC))
    release(allocation, at=datetime(2025, 1, 1, 0, 0, tzinfo=UTC))
    kinds = list(MeterEntry.objects.order_by("period_start").values_list("kind", "microseconds"))
    assert kinds == [("accrual", 3_600_000_000), ("final", 3_600_000_000)]


def test_an_allocation_released_at_its_rent_instant_has_no_rows(team, node):
    allocation = rent(team=team, node=node, at=T0)
    release(allocation, at=T0)
    assert MeterEntry.objects.count() == 0
    assert services.find_violations(now=T0 + timedelta(days=1)) == []


def test_accrual_never_closes_the_hour_still_running(team, node):
    allocation = rent(team=team, node=node, at=T0)
    services.accrue_meter(now=floor_hour(T0) + 2 * HOUR + timedelta(minutes=30))
    last = MeterEntry.objects.filter(allocation=allocation).order_by("-period_start").first()
    assert last.period_end == floor_hour(T0) + 2 * HOUR


def test_accrual_leaves_the_first_minute_after_the_hour_to_a_release_in_flight(team, node):
    rent(team=team, node=node, at=T0)
    services.accrue_meter(now=floor_hour(T0) + HOUR + timedelta(seconds=30))
    assert MeterEntry.objects.count() == 0
    services.accrue_meter(now=floor_hour(T0) + HOUR + timedelta(seconds=61))
    assert MeterEntry.objects.count() == 1


@DB_EXAMPLES
@given(
    boundary=st.sampled_from(BOUNDARIES),
    offset=offsets,
    held=st.integers(1, 3 * DAY_US),
    silent=st.integers(0, 3_600_000_000),
)
def test_node_loss_closes_the_meter_when_the_node_is_declared_down(
    team, node, boundary, offset, held, silent
):
    rented_at = boundary + timedelta(microseconds=offset)
    down_at = rented_at + timedelta(microseconds=held)

    def example() -> None:
        allocation = rent(team=team, node=node, at=rented_at)
        services.accrue_meter(now=rented_at + (down_at - rented_at) / 2)
        heartbeat = down_at - timedelta(microseconds=silent)
        Node.objects.filter(id=node.id).update(last_heartbeat=heartbeat)
        node.refresh_from_db()
        closed = [row.period_end for row in MeterEntry.objects.filter(allocation=allocation)]
        rental.lose_node_allocations(node=node, now=down_at, detail="silent past its timeout")
        allocation.refresh_from_db()
        # Lost when the reaper would have found it (never after it did), never before RENT or a closed hour.
        lost_at = min(down_at, heartbeat + timedelta(seconds=django_settings.E31_NODE_TIMEOUT_S))
        assert allocation.released_at == max([lost_at, rented_at, *closed])
        assert allocation.end_reason == EndReason.NODE_LOST
        assert allocation.last_heartbeat_at_release == heartbeat
        assert Job.objects.get(id=allocation.job_id).state in (State.RELEASED, State.QUEUED)
        assert_exact(allocation, now=down_at + timedelta(hours=3))

    isolated(example)


def test_several_allocations_and_attempts_each_tile_their_own_span(team, other_team, node):
    spans = [(T0, T0 + timedelta(hours=30)), (T0 + timedelta(minutes=13), T0 + timedelta(hours=2))]
    allocations = [rent(team=t, node=node, at=s) for t, (s, _) in zip([team, other_team], spans, strict=True)]
    services.accrue_meter(now=T0 + timedelta(hours=1, minutes=45))
    for allocation, (_, end) in zip(allocations, spans, strict=True):
        release(allocation, at=end)
    services.accrue_meter(now=T0 + timedelta(days=3))
    assert services.find_violations(now=T0 + timedelta(days=3)) == []
    assert {a.id: metered_micros(a) for a in allocations} == {
        a.id: micros(end - start) for a, (start, end) in zip(allocations, spans, strict=True)
    }


def test_beat_runs_the_accrual_task_by_the_name_in_its_schedule(
    settings, team, node, time_machine, monkeypatch
):
    from e31web.celery import app
    from metering import tasks

    assert settings.CELERY_BEAT_SCHEDULE["accrue-meter-hourly"]["task"] in app.tasks
    rent(team=team, node=node, at=T0)
    time_machine.move_to(T0 + timedelta(hours=3), tick=False)
    monkeypatch.setattr(tasks.clock, "database_now", lambda: T0 + timedelta(hours=3))
    tasks.accrue_meter()
    assert MeterEntry.objects.count() == 3


def test_the_accrual_closes_no_hour_the_databases_clock_has_not_ended(team, node, time_machine):
    """The beat machine's clock two hours ahead of the database's: the accrual, dated by it, closed hours that had
    not ended, and a RELEASE, never dated before an hour its meter closed, would have been dated in the future."""
    from metering import tasks

    database_now = timezone.now()
    rent(team=team, node=node, at=database_now - timedelta(hours=3))
    time_machine.move_to(database_now + timedelta(hours=2), tick=False)
    tasks.accrue_meter()
    closed = MeterEntry.objects.order_by("-period_end").values_list("period_end", flat=True).first()
    assert closed is not None and closed <= database_now


def test_a_release_dated_before_an_hour_the_accrual_closed_is_moved_to_that_hours_end(team, node):
    """Reproduction: a RELEASE read its `now` 10 s before the hour, and reached the database after the hourly
    accrual had closed that hour (a release waiting past the accrual's minute of grace, or the beat's clock ahead):
    its final row conflicted with the accrual's and was dropped, the ledger held 10 s more than RELEASE - RENT, and
    check_ledger reported it for ever (an adjustment cannot clear a metered row lying past the RELEASE)."""
    hour = datetime(2024, 3, 10, 11, tzinfo=UTC)
    allocation = rent(team=team, node=node, at=hour - timedelta(minutes=30))
    services.accrue_meter(now=hour + timedelta(seconds=61))

    release(allocation, at=hour - timedelta(seconds=10))

    allocation.refresh_from_db()
    assert allocation.released_at == hour
    assert_exact(allocation, now=hour + timedelta(hours=2))
