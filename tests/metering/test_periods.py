"""The pure hour arithmetic: slices tile any span exactly, in whole microseconds."""

from datetime import UTC, datetime, timedelta, timezone
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metering import invariants
from metering.periods import HOUR, floor_hour, hour_slices, micros, months_back, next_month, spread_over_hours

instants = st.datetimes(
    min_value=datetime(2023, 12, 25), max_value=datetime(2025, 1, 5), timezones=st.just(UTC)
)
spans = st.integers(min_value=0, max_value=5 * 24 * 3_600_000_000).map(lambda us: timedelta(microseconds=us))


@given(start=instants, span=spans)
def test_hour_slices_tile_the_span_exactly_and_never_cross_an_hour(start, span):
    slices = list(hour_slices(start, start + span))
    assert sum(micros(end - begin) for begin, end in slices) == micros(span)
    assert all(end > begin and end <= floor_hour(begin) + HOUR for begin, end in slices)
    assert all(a[1] == b[0] for a, b in pairwise(slices))
    if slices:
        assert slices[0][0] == start and slices[-1][1] == start + span


@given(start=instants, span=spans, amount=st.integers(min_value=-(10**13), max_value=10**13).filter(bool))
def test_a_correction_spread_over_hours_adds_up_exactly_and_never_crosses_an_hour(start, span, amount):
    shares = spread_over_hours(start, start + span, amount)
    assert sum(share for _, _, share in shares) == amount
    assert all(share != 0 and (share > 0) == (amount > 0) for _, _, share in shares)
    assert all(stop <= floor_hour(begin) + HOUR for begin, stop, _ in shares)


def test_a_correction_no_longer_than_its_window_is_shared_by_the_slices_lengths():
    start = datetime(2024, 12, 31, 23, 50, tzinfo=UTC)
    shares = spread_over_hours(start, start + timedelta(minutes=20), -1_200_000_000)
    assert [share for _, _, share in shares] == [-600_000_000, -600_000_000]


def test_hour_slices_are_cut_in_utc_whatever_the_instants_timezone():
    plus_half = timezone(timedelta(hours=5, minutes=30))
    start = datetime(2024, 1, 1, 5, 45, tzinfo=plus_half)  # 00:15 UTC
    assert [s[1] for s in hour_slices(start, start + timedelta(hours=1))] == [
        datetime(2024, 1, 1, 1, tzinfo=UTC),
        datetime(2024, 1, 1, 1, 15, tzinfo=UTC),
    ]


def test_naive_instants_are_refused():
    with pytest.raises(ValueError):
        list(hour_slices(datetime(2024, 1, 1), datetime(2024, 1, 2)))


def test_month_arithmetic_crosses_the_year():
    december = datetime(2024, 12, 1, tzinfo=UTC)
    assert next_month(december) == datetime(2025, 1, 1, tzinfo=UTC)
    assert months_back(datetime(2025, 1, 1, tzinfo=UTC), 1) == december
    assert months_back(december, 12) == datetime(2023, 12, 1, tzinfo=UTC)


def _held(rented, released):
    return invariants.Held(1, 1, 1, 2, rented, released)


def _rows(rented, released, *, kind_last="final"):
    slices = list(hour_slices(rented, released))
    return [
        invariants.Row(1, 1, s, e, 2, micros(e - s), kind_last if i == len(slices) - 1 else "accrual")
        for i, (s, e) in enumerate(slices)
    ]


def test_the_checker_accepts_an_exact_tiling_and_names_a_gap():
    rented = datetime(2024, 2, 29, 23, 30, tzinfo=UTC)
    released = rented + timedelta(hours=3, microseconds=7)
    rows = _rows(rented, released)
    assert invariants.problems(_held(rented, released), rows, closed_until=released) == []
    problems = invariants.problems(_held(rented, released), rows[:1] + rows[2:], closed_until=released)
    assert any("gap" in p for p in problems) and any("RELEASE - RENT" in p for p in problems)


def test_the_checker_names_an_overlap_and_a_row_outside_release():
    rented = datetime(2024, 2, 29, 23, 30, tzinfo=UTC)
    released = rented + timedelta(hours=2)
    rows = _rows(rented, released)
    problems = invariants.problems(
        _held(rented, released - timedelta(minutes=1)), rows + rows[-1:], closed_until=released
    )
    assert any("overlap" in p for p in problems) and any("outside RENT..RELEASE" in p for p in problems)


def test_the_checker_wants_every_completed_hour_of_a_held_allocation_closed():
    rented = datetime(2024, 2, 29, 23, 30, tzinfo=UTC)
    closed = _rows(rented, datetime(2024, 3, 1, 1, tzinfo=UTC), kind_last="accrual")
    held = _held(rented, None)
    assert invariants.problems(held, closed, closed_until=datetime(2024, 3, 1, 1, 59, tzinfo=UTC)) == []
    assert invariants.problems(held, closed, closed_until=datetime(2024, 3, 1, 2, 1, tzinfo=UTC))


def test_the_checker_names_an_adjustment_booked_to_another_team_or_job():
    """An adjustment row on one team's allocation naming another team and job moved GPU-hours between teams'
    ledgers, and the check said nothing: it read only the metered rows' names."""
    rented = datetime(2024, 2, 29, 23, 30, tzinfo=UTC)
    released = rented + timedelta(hours=1)
    moved = invariants.Row(7, 2, released, released, 2, 3_600_000_000, "adjustment")
    problems = invariants.problems(
        _held(rented, released), [*_rows(rented, released), moved], closed_until=released
    )
    assert any("names job 7 / team 2" in p for p in problems)


def test_the_checker_names_metered_time_later_than_now():
    """Rows accrued past the database's own clock (a skewed writer), and a RELEASE then moved up to them, were
    both taken as a correct ledger: hours billed that were never held."""
    rented = datetime(2024, 2, 29, 10, 15, tzinfo=UTC)
    now = datetime(2024, 2, 29, 12, 30, tzinfo=UTC)
    ahead = _rows(rented, datetime(2024, 2, 29, 17, tzinfo=UTC), kind_last="accrual")
    assert any(
        "after now" in p for p in invariants.problems(_held(rented, None), ahead, closed_until=now, now=now)
    )
    released = datetime(2024, 2, 29, 17, tzinfo=UTC)
    problems = invariants.problems(
        _held(rented, released), _rows(rented, released), closed_until=now, now=now
    )
    assert any("after now" in p for p in problems)
