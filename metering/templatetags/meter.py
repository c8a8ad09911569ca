"""{% load meter %}: the job page's meter block and the ledger's display filters."""

from django import template
from django.utils import timezone

from jobs import selectors as job_selectors
from jobs.models import Job
from metering import reports, selectors
from metering.models import format_seconds
from metering.periods import MICROS_PER_HOUR

register = template.Library()


@register.inclusion_tag("metering/_job_meter.html", takes_context=True)
def job_meter(context, job: Job) -> dict:
    """The job's ledger rows grouped by allocation (attempt, node), for the job page."""
    parts = selectors.job_meter(job, now=timezone.now())
    uses = job_selectors.gpu_use_by_allocation([p.allocation for p in parts]) if parts else {}
    user = context.get("user") or getattr(context.get("request"), "user", None)
    gpu_micros, open_micros = sum(p.gpu_micros for p in parts), sum(p.open_micros for p in parts)
    return {
        "job": job,
        "parts": [(part, uses[part.allocation.id]) for part in parts],
        "gpu_use": job_selectors.gpu_use_by_job([job.id])[job.id] if parts else None,
        "gpu_micros": gpu_micros,
        "open_micros": open_micros,
        "so_far_micros": gpu_micros + open_micros,
        "holding": any(p.allocation.released_at is None for p in parts),
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
