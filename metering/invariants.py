"""What a correct ledger looks like for one allocation. Pure Python: rows in, problems out.

The reconciliation command, the staff check page and the property tests all ask this one
function, so "correct" means the same thing everywhere.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from metering.periods import HOUR, floor_hour, micros

ADJUSTMENT = "adjustment"
FINAL = "final"


@dataclass(frozen=True)
class Held:
    """An allocation as the meter sees it."""

    id: int
    job_id: int
    team_id: int
    gpus: int
    rented_at: datetime
    released_at: datetime | None


@dataclass(frozen=True)
class Row:
    job_id: int
    team_id: int
    period_start: datetime
    period_end: datetime
    gpus: int
    microseconds: int
    kind: str


def problems(
    held: Held, rows: Sequence[Row], *, closed_until: datetime, now: datetime | None = None
) -> list[str]:
    """Every way ``rows`` fail to tile RENT..RELEASE exactly (or, while held, up to ``closed_until``); and, given
    ``now``, time metered (or a RELEASE) later than now, which nobody can have held yet."""
    metered = sorted((r for r in rows if r.kind != ADJUSTMENT), key=lambda r: r.period_start)
    found = [p for row in metered for p in _row_problems(held, row)]
    found += [p for row in rows if row.kind == ADJUSTMENT for p in _named_problems(held, row)]
    if now is not None:
        found += _future_problems(held, metered, now=now)
    found += _tiling_problems(held, metered)
    found += _coverage_problems(held, metered, closed_until=closed_until)
    total = sum(r.gpus * r.microseconds for r in rows)
    if total < 0:
        found.append("adjustments credit more GPU-time than was metered")
    return found


def _named_problems(held: Held, row: Row) -> list[str]:
    """A row (an adjustment too) is booked to its allocation's job and team: one naming another moves GPU-time
    from one team's ledger into another's."""
    if (row.job_id, row.team_id) == (held.job_id, held.team_id):
        return []
    at = f"{'adjustment' if row.kind == ADJUSTMENT else 'row'} {row.period_start:%Y-%m-%d %H:%M:%S.%f}"
    return [f"{at} names job {row.job_id} / team {row.team_id}, not the allocation's"]


def _future_problems(held: Held, metered: Sequence[Row], *, now: datetime) -> list[str]:
    found = (
        [f"RELEASE at {held.released_at:%Y-%m-%d %H:%M:%S.%f} is after now"]
        if (held.released_at and held.released_at > now)
        else []
    )
    ahead = [r for r in metered if r.period_end > now]
    if ahead:
        found.append(f"{len(ahead)} row(s) end after now, up to {ahead[-1].period_end:%Y-%m-%d %H:%M:%S.%f}")
    return found


def _row_problems(held: Held, row: Row) -> list[str]:
    at = f"row {row.period_start:%Y-%m-%d %H:%M:%S.%f}"
    found = _named_problems(held, row)
    if row.gpus != held.gpus:
        found.append(f"{at} meters {row.gpus} GPUs; the allocation holds {held.gpus}")
    if row.microseconds != micros(row.period_end - row.period_start):
        found.append(
            f"{at} holds {row.microseconds} µs but its period lasts {micros(row.period_end - row.period_start)} µs"
        )
    if row.period_end > floor_hour(row.period_start) + HOUR:
        found.append(f"{at} crosses a UTC hour boundary")
    if row.period_start < held.rented_at or (held.released_at and row.period_end > held.released_at):
        found.append(f"{at} lies outside RENT..RELEASE")
    if row.kind == FINAL and row.period_end != held.released_at:
        found.append(f"{at} is final but does not end at RELEASE")
    return found


def _tiling_problems(held: Held, metered: Sequence[Row]) -> list[str]:
    found, cursor = [], held.rented_at
    for row in metered:
        if row.period_start > cursor:
            found.append(f"gap from {cursor:%Y-%m-%d %H:%M:%S.%f} to {row.period_start:%Y-%m-%d %H:%M:%S.%f}")
        elif row.period_start < cursor:
            found.append(f"overlap at {row.period_start:%Y-%m-%d %H:%M:%S.%f}")
        cursor = max(cursor, row.period_end)
    return found


def _coverage_problems(held: Held, metered: Sequence[Row], *, closed_until: datetime) -> list[str]:
    closed_to = metered[-1].period_end if metered else held.rented_at
    if held.released_at is not None:
        total = sum(r.microseconds for r in metered)
        expected = micros(held.released_at - held.rented_at)
        if total != expected:
            return [f"metered {total} µs per GPU, but RELEASE - RENT is {expected} µs"]
        if closed_to != held.released_at:
            return [
                f"metered up to {closed_to:%Y-%m-%d %H:%M:%S.%f}, released at {held.released_at:%Y-%m-%d %H:%M:%S.%f}"
            ]
        return []
    due = floor_hour(closed_until)
    if held.rented_at < due and closed_to < due:
        return [
            f"held, but closed only up to {closed_to:%Y-%m-%d %H:%M} of the hours completed by {due:%Y-%m-%d %H:%M}"
        ]
    return []


@dataclass(frozen=True)
class Span:
    """The GPUs an allocation held on its node, from RENT to RELEASE (None: held still)."""

    id: int
    node: str
    gpu_indices: tuple[int, ...]
    rented_at: datetime
    released_at: datetime | None


def shared_gpus(spans: Iterable[Span]) -> list[str]:
    """Each allocation holding a GPU of a node while another held it: two ledgers metered for one GPU. ``spans`` in
    (node, RENT) order. Each allocation's rows tile its own span, so this is the one way two teams can pay for the
    same GPU-time and every other check still pass; RENT's one active hold per GPU keeps it from happening."""
    found, held_until = [], {}  # (node, GPU) -> (allocation, release) of the last holder seen
    for span in spans:
        for gpu in span.gpu_indices:
            before = held_until.get((span.node, gpu))
            if before is not None and (before[1] is None or before[1] > span.rented_at):
                until = "still" if before[1] is None else f"until {before[1]:%Y-%m-%d %H:%M:%S}"
                found.append(
                    f"allocation {span.id} holds GPU {gpu} of {span.node} from {span.rented_at:%Y-%m-%d %H:%M:%S} "
                    f"while allocation {before[0]} held it ({until}): one GPU metered twice"
                )
            if before is None or (
                before[1] is not None and (span.released_at is None or span.released_at > before[1])
            ):
                held_until[(span.node, gpu)] = (span.id, span.released_at)
    return found
