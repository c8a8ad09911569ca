"""UTC hour arithmetic for the meter. Pure Python, no Django: instants in, values out.

The ledger's unit is the microsecond, the resolution of both PostgreSQL timestamps and Python
datetimes, so slicing RENT..RELEASE into hours loses nothing and the slices add up exactly.
"""

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta

HOUR = timedelta(hours=1)
MICROSECOND = timedelta(microseconds=1)
MICROS_PER_HOUR = 3_600_000_000


def utc(instant: datetime) -> datetime:
    if instant.tzinfo is None:
        raise ValueError("the meter needs timezone-aware instants")
    return instant.astimezone(UTC)


def floor_hour(instant: datetime) -> datetime:
    return utc(instant).replace(minute=0, second=0, microsecond=0)


def micros(delta: timedelta) -> int:
    """A timedelta as whole microseconds, exactly (timedelta's own resolution)."""
    return delta // MICROSECOND


def hour_slices(start: datetime, end: datetime) -> Iterator[tuple[datetime, datetime]]:
    """[start, end) cut at every UTC hour boundary: contiguous, non-empty, in order."""
    cursor, end = utc(start), utc(end)
    while cursor < end:
        boundary = floor_hour(cursor) + HOUR
        stop = min(boundary, end)
        yield cursor, stop
        cursor = stop


def spread_over_hours(start: datetime, end: datetime, amount: int) -> list[tuple[datetime, datetime, int]]:
    """``amount`` (signed µs) shared over the hour slices of [start, end) in proportion to their
    lengths, the rounding remainder on the last slice; the shares add up to ``amount`` exactly, and
    a slice whose share rounds to nothing is left out.

    A correction is cut where metered rows are, so each UTC day and month is credited the part
    of it that lies in that day or month. An empty span gives one slice holding all of ``amount``.
    """
    slices = list(hour_slices(start, end)) or [(start, end)]
    span, size = micros(end - start), abs(amount)
    shares = [size * micros(stop - begin) // span for begin, stop in slices[:-1]]
    shares.append(size - sum(shares))
    sign = -1 if amount < 0 else 1
    return [(begin, stop, sign * share) for (begin, stop), share in zip(slices, shares, strict=True) if share]


def month_start(day: date | datetime) -> datetime:
    return datetime(day.year, day.month, 1, tzinfo=UTC)


def next_month(start: datetime) -> datetime:
    return datetime(start.year + start.month // 12, start.month % 12 + 1, 1, tzinfo=UTC)


def months_back(start: datetime, count: int) -> datetime:
    """The first instant of the month ``count`` months before ``start``'s month."""
    index = start.year * 12 + start.month - 1 - count
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def day_start(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def gpu_hours(gpu_micros: int) -> float:
    return gpu_micros / MICROS_PER_HOUR
