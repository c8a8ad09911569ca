"""{% load meter %}: the job page's meter block and the ledger's display filters."""

from dataclasses import dataclass
from datetime import timedelta
from itertools import groupby

from django import template

from jobs.models import Allocation, Job
from metering import reports
from metering.models import MeterEntry, format_seconds
from metering.periods import MICROS_PER_HOUR

register = template.Library()


@dataclass(frozen=True)
class MeterPart:
    """One allocation's meter: when it started and stopped, why, and its rows."""

    allocation: Allocation
    entries: list[MeterEntry]

    @property
    def gpu_micros(self) -> int:
        return sum(e.gpus * e.microseconds for e in self.entries)

    @property
    def heartbeat_gap(self) -> timedelta | None:
        a = self.allocation
        if a.last_heartbeat_at_release and a.released_at:
            return a.released_at - a.last_heartbeat_at_release
        return None

    @property
    def adjusted(self) -> bool:
        return any(e.kind == MeterEntry.Kind.ADJUSTMENT for e in self.entries)


@register.inclusion_tag("metering/_job_meter.html", takes_context=True)
def job_meter(context, job: Job) -> dict:
    """The job's ledger rows grouped by allocation (attempt, node), for the job page."""
    allocations = list(job.allocations.select_related("node").order_by("attempt", "rank", "id"))
    rows = MeterEntry.objects.filter(job=job).order_by("allocation_id", "period_start", "id")
    by_allocation = {key: list(group) for key, group in groupby(rows, key=lambda e: e.allocation_id)}
    parts = [MeterPart(a, by_allocation.get(a.id, [])) for a in allocations]
    user = context.get("user") or getattr(context.get("request"), "user", None)
    return {
        "job": job,
        "parts": parts,
        "gpu_micros": sum(p.gpu_micros for p in parts),
        "is_operator": bool(user and user.is_staff),
        "rate": reports.rate(),
    }


@register.filter
def gpu_hours_of(gpu_micros: int | None) -> str:
    """GPU-microseconds as GPU-hours, three decimals."""
    return "—" if gpu_micros is None else f"{gpu_micros / MICROS_PER_HOUR:,.3f}"


@register.filter
def seconds_of(microseconds: int | None) -> str:
    """Exact seconds, six decimals."""
    return "—" if microseconds is None else format_seconds(microseconds)


@register.filter
def money(gpu_micros: int | None) -> str:
    """The display-time cost, or nothing at all when no rate is configured."""
    value = None if gpu_micros is None else reports.cost(gpu_micros)
    return "" if value is None else f"{value:,.2f}"
