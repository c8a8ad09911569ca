"""What the ledger pages, exports and API read: totals by month, day, job and team, and the live hour.

Read-only. Every figure is a sum of ledger rows in exact GPU-microseconds; conversion to GPU-hours
(and to money, only when a rate is configured) happens at display time.
"""

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Case, CharField, Count, F, Func, Min, OuterRef, QuerySet, Subquery, Sum, When

from accounts.models import Team
from common import scales
from jobs import selectors as job_selectors
from jobs.models import Allocation
from metering.models import LedgerDay, LedgerJobMonth, MeterEntry
from metering.periods import (
    MICROS_PER_HOUR,
    day_start,
    floor_hour,
    micros,
    months_back,
    next_month,
)

GPU_MICROS = Sum(F("gpus") * F("microseconds"))
ADJUSTMENT = MeterEntry.Kind.ADJUSTMENT
JOB_LIMIT = 200


@dataclass(frozen=True)
class Bucket:
    start: datetime
    gpu_micros: int

    @property
    def gpu_hours(self) -> float:
        return self.gpu_micros / MICROS_PER_HOUR


def entries(team: Team | None) -> QuerySet:
    """The ledger of one team, or of every team (``None``, for operators)."""
    return MeterEntry.objects.all() if team is None else MeterEntry.objects.filter(team=team)


def in_range(team: Team | None, start: datetime, end: datetime) -> QuerySet:
    """Rows by the period they meter; a metered row never crosses an hour, so days and months split cleanly."""
    return entries(team).filter(period_start__gte=start, period_start__lt=end)


def days(team: Team | None, start: datetime, end: datetime) -> QuerySet:
    """The daily summary (kept by the ledger's trigger) of one team, or of every team, in [start, end)."""
    rows = LedgerDay.objects.filter(day__gte=start.date(), day__lt=end.date())
    return rows if team is None else rows.filter(team=team)


def _by_day_totals(team: Team | None, start: datetime, end: datetime) -> dict[date, int]:
    rows = days(team, start, end).values("day").annotate(total=Sum("gpu_micros")).order_by()
    return {r["day"]: int(r["total"]) for r in rows}


def by_month(*, team: Team | None, until: datetime, months: int = 12) -> list[Bucket]:
    """The ``months`` months ending with ``until``'s month, oldest first, empty months included."""
    first = months_back(until, months - 1)
    totals: dict[date, int] = {}
    for day, total in _by_day_totals(team, first, next_month(until)).items():
        totals[day.replace(day=1)] = totals.get(day.replace(day=1), 0) + total
    starts = [months_back(until, n) for n in range(months - 1, -1, -1)]
    return [Bucket(s, totals.get(s.date(), 0)) for s in starts]


def by_day(*, team: Team | None, month: datetime) -> list[Bucket]:
    """Every day of ``month`` with its GPU-micros, empty days included."""
    totals = _by_day_totals(team, month, next_month(month))
    count = (next_month(month) - month).days
    return [
        Bucket(month + timedelta(days=d), totals.get((month + timedelta(days=d)).date(), 0))
        for d in range(count)
    ]


@dataclass(frozen=True)
class JobLine:
    job_id: int
    name: str
    team: str
    metered: int
    adjusted: int
    gpu_use: job_selectors.GpuUse | None = None  # how busy the GPUs it held were
    array_id: int | None = None  # a line for a whole array: its tasks summed, job_id its first task
    tasks: int = 0

    @property
    def gpu_micros(self) -> int:
        return self.metered + self.adjusted


@dataclass(frozen=True)
class Statement:
    """One team's (or every team's) month: the total, its adjustments, and the jobs behind it."""

    month: datetime
    metered: int
    adjusted: int
    jobs: list[JobLine]
    job_count: int
    cut: bool  # lines past JOB_LIMIT were left off ``jobs`` (an array is one line, however many tasks)

    @property
    def gpu_micros(self) -> int:
        return self.metered + self.adjusted


def statement(*, team: Team | None, month: datetime) -> Statement:
    """Totals and the largest jobs of a month, from the per-job monthly summary (kept by the
    ledger's trigger): a few thousand summary rows instead of every ledger row of the month."""
    rows = LedgerJobMonth.objects.filter(month=month.date())
    rows = rows if team is None else rows.filter(team=team)
    totals = rows.aggregate(metered=Sum("metered"), adjusted=Sum("adjusted"), jobs=Count("id"))
    lines = _lines(rows)
    cut = len(lines) > JOB_LIMIT
    lines = lines[:JOB_LIMIT]
    singles = [line.job_id for line in lines if line.array_id is None]
    uses = job_selectors.gpu_use_by_job(singles) if singles else {}
    lines = [
        dataclasses.replace(line, gpu_use=uses.get(line.job_id)) if line.array_id is None else line
        for line in lines
    ]
    metered, adjusted = int(totals["metered"] or 0), int(totals["adjusted"] or 0)
    return Statement(month, metered, adjusted, lines, totals["jobs"], cut)


def _lines(rows: QuerySet) -> list[JobLine]:
    """The largest lines of the month in one grouped query: a job each, and one per array (its tasks
    summed); one past ``JOB_LIMIT`` when there are more, so the caller knows some were left off."""
    grouped = (
        rows.values("team__slug", "job__array_id", single=Case(When(job__array__isnull=True, then=F("job_id"))))
        .annotate(
            first=Min("job_id"), name=Min("job__name"), metered_sum=Sum("metered"), adjusted_sum=Sum("adjusted"),
            tasks=Count("id"),
        )
        .annotate(total=F("metered_sum") + F("adjusted_sum"))
        .order_by("-total", "first")[: JOB_LIMIT + 1]
    )  # fmt: skip
    return [
        JobLine(g["first"], g["name"], g["team__slug"], int(g["metered_sum"]), int(g["adjusted_sum"]),
                array_id=g["job__array_id"], tasks=g["tasks"] if g["job__array_id"] else 0)
        for g in grouped
    ]  # fmt: skip


def by_team(*, month: datetime) -> dict[int, int]:
    """Operators' overview: each team's GPU-micros in the month."""
    rows = days(None, month, next_month(month)).values("team_id").annotate(total=Sum("gpu_micros")).order_by()
    return {r["team_id"]: int(r["total"]) for r in rows}


@dataclass(frozen=True)
class LivePart:
    """A held allocation: what the ledger has closed, and what is accruing now."""

    allocation: Allocation
    closed_to: datetime
    unclosed_micros: int  # per GPU, from the last closed period to now
    this_hour_micros: int  # per GPU, in the current UTC hour

    @property
    def gpus(self) -> int:
        return self.allocation.gpu_count

    @property
    def unclosed_gpu_micros(self) -> int:
        return self.gpus * self.unclosed_micros

    @property
    def this_hour_gpu_micros(self) -> int:
        return self.gpus * self.this_hour_micros


def live(*, team: Team | None, now: datetime) -> list[LivePart]:
    """Held allocations, accruing: the current hour is only written when it completes (or at RELEASE)."""
    last_end = (
        MeterEntry.objects.filter(allocation=OuterRef("pk"))
        .exclude(kind=ADJUSTMENT)
        .order_by("-period_start")
        .values("period_end")[:1]
    )
    held = Allocation.objects.filter(released_at__isnull=True).select_related("job__team", "node")
    held = held if team is None else held.filter(job__team=team)
    hour = floor_hour(now)
    return [
        LivePart(a, a.last_end or a.rented_at, micros(now - (a.last_end or a.rented_at)), micros(now - max(hour, a.rented_at)))
        for a in held.annotate(last_end=Subquery(last_end)).order_by("rented_at", "id")
    ]  # fmt: skip


def node_losses(*, team: Team | None, month: datetime) -> QuerySet:
    """Allocations whose meter closed on node loss this month, with the node's last heartbeat."""
    lost = Allocation.objects.filter(
        end_reason="node_lost", released_at__gte=month, released_at__lt=next_month(month)
    ).select_related("job__team", "node")
    return (lost if team is None else lost.filter(job__team=team)).order_by("-released_at")


# --- exports

EXPORT_COLUMNS = (
    "period_start", "period_end", "team", "job", "allocation", "gpus", "seconds", "gpu_hours",
    "kind", "reason", "created_by", "created_at",
)  # fmt: skip


class UtcIso(Func):
    """A timestamp as fixed-width ISO 8601 UTC text, formatted by the database.

    Parsing a million timestamps into datetimes only to print them again was most of an export's
    time; the database writes the text directly, the same on both backends.
    """

    output_field = CharField()
    template = "to_char(%(expressions)s AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"

    def as_sqlite(self, compiler, connection, **extra):
        # Django stores UTC as 'YYYY-MM-DD HH:MM:SS[.ffffff]' text on SQLite.
        return self.as_sql(compiler, connection, template=SQLITE_ISO, **extra)


SQLITE_ISO = (
    "(substr(%(expressions)s, 1, 10) || 'T' || substr(%(expressions)s, 12, 8) || '.' "
    "|| substr(%(expressions)s || '.000000', 21, 6) || 'Z')"
)


def export_rows(*, team: Team | None, start: datetime, end: datetime) -> Iterator[dict]:
    """Ledger rows in [start, end) as plain dicts of text and numbers, streamed from a server-side cursor; each
    also carries its exact GPU-microseconds (``gpu_us``, not an export column) for what is worked out from it."""
    teams = dict(Team.objects.values_list("id", "slug"))
    fields = (
        "start_text", "end_text", "team_id", "job_id", "allocation_id", "gpus", "microseconds",
        "kind", "reason", "created_by__username", "at_text",
    )  # fmt: skip
    rows = (
        in_range(team, start, end)
        .order_by("period_start", "allocation_id", "id")
        .annotate(
            start_text=UtcIso("period_start"), end_text=UtcIso("period_end"), at_text=UtcIso("created_at")
        )
        .values_list(*fields)
        .iterator(chunk_size=5000)
    )
    for ps, pe, team_id, job_id, alloc_id, gpus, us, kind, reason, author, created in rows:
        yield {
            "period_start": ps, "period_end": pe, "team": teams.get(team_id, ""),
            "job": job_id, "allocation": alloc_id, "gpus": gpus, "seconds": _seconds(us),
            "gpu_hours": _gpu_hours(gpus * us), "kind": kind, "reason": reason,
            "created_by": author or "", "created_at": created, "gpu_us": gpus * us,
        }  # fmt: skip


def _seconds(us: int) -> str:
    sign = "-" if us < 0 else ""
    whole, frac = divmod(abs(us), 1_000_000)
    return f"{sign}{whole}.{frac:06d}"


def _gpu_hours(gpu_us: int) -> str:
    """GPU-hours to nine places, rounded half-even, in integer arithmetic (no float, no Decimal context)."""
    nano, rest = divmod(abs(gpu_us) * 10, 36)  # GPU-nanohours: 1 GPU-hour = 3.6e9 GPU-us = 1e9 nanohours
    if rest * 2 > 36 or (rest * 2 == 36 and nano % 2):
        nano += 1
    whole, frac = divmod(nano, 1_000_000_000)
    return f"{'-' if gpu_us < 0 and nano else ''}{whole}.{frac:09d}"


def parse_range(start: str | None, end: str | None, *, today: date) -> tuple[datetime, datetime]:
    """YYYY-MM-DD..YYYY-MM-DD, both days included, as [start, end) instants; defaults to this month."""
    first = _day(start, "start") if start else today.replace(day=1)
    last = _day(end, "end") if end else (next_month(day_start(first)) - timedelta(days=1)).date()
    if last < first:
        raise ValueError("the end date is before the start date")
    if last == date.max:  # the range ends at the next day's start, past what a date holds
        raise ValueError(f"the end date must be before {date.max.isoformat()}")
    return day_start(first), day_start(last) + timedelta(days=1)


def _day(text: str, which: str) -> date:
    """The day ``text`` names; the error names the field, never repeats what was typed (a crafted link's words
    would be drawn on the console's page)."""
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"the {which} date is not a date: write YYYY-MM-DD") from None


# --- rates: display only, never stored


def rate() -> Decimal | None:
    """The configured price of one GPU-hour, or None: then no money appears anywhere."""
    raw = str(getattr(settings, "E31_RATE_PER_GPU_HOUR", "") or "").strip()
    if not raw:
        return None
    try:
        value = Decimal(raw)
    except InvalidOperation as exc:
        raise ImproperlyConfigured(f"E31_RATE_PER_GPU_HOUR must be a number, got {raw!r}") from exc
    if value < 0:
        raise ImproperlyConfigured("E31_RATE_PER_GPU_HOUR cannot be negative")
    return value


def row_cost(gpu_micros: int, price: Decimal) -> Decimal:
    """One row's cost to the millionth: rounded to the cent, a month of short rows summed to 20 % over the
    ledger's cost (60 one-minute rows at 1.00: 60 x 0.02). The ledger rounds its total once, to the cent."""
    return (Decimal(gpu_micros) * price / MICROS_PER_HOUR).quantize(Decimal("0.000001"))


def cost(gpu_micros: int) -> Decimal | None:
    price = rate()
    if price is None:
        return None
    return (Decimal(gpu_micros) * price / MICROS_PER_HOUR).quantize(Decimal("0.01"))


# --- the daily chart, as geometry for an inline SVG (no script: CSP allows only our own files)


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str
    title: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    baseline: float
    bars: list[Bar]
    peak: str
    ticks: list[tuple[float, str]]


def day_chart(days: list[Bucket], *, width: int = 720, height: int = 180) -> Chart:
    """Bars scaled to the busiest day; labels on the 1st and every 5th day."""
    top, bottom, left = 12.0, 22.0, 4.0
    plot = height - top - bottom
    # The scale ends at a round figure above the busiest day: a day of 0.014 GPU-hours is a short bar
    # under "0.02", not a full-height one under "0.0"; an empty month draws none under "0".
    peak = scales.nice_ceiling(max((d.gpu_hours for d in days), default=0.0))
    slot = (width - left) / max(1, len(days))
    bars = [
        _bar(d, i, slot=slot, left=left, top=top, plot=plot, peak=peak or 1.0) for i, d in enumerate(days)
    ]
    ticks = [
        (round(left + i * slot + slot / 2, 2), f"{d.start.day}") for i, d in enumerate(days) if _labelled(d)
    ]
    return Chart(width, height, height - bottom, bars, scales.figure(peak), ticks)


def _labelled(day: Bucket) -> bool:
    return day.start.day == 1 or day.start.day % 5 == 0


def _bar(day: Bucket, i: int, *, slot: float, left: float, top: float, plot: float, peak: float) -> Bar:
    h = max(0.0, day.gpu_hours) / peak * plot
    title = f"{day.start:%Y-%m-%d}: {day.gpu_hours:,.3f} GPU-hours"
    return Bar(
        round(left + i * slot + 1, 2),
        round(top + plot - h, 2),
        round(max(1.0, slot - 2), 2),
        round(h, 2),
        f"{day.start.day}",
        title,
    )
