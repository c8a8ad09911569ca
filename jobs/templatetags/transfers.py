"""Display helpers for staging and delivery: rates, ETAs, the cache's configured policy."""

from django import template
from django.conf import settings

from jobs.units import format_size

register = template.Library()


@register.filter
def rate(bytes_per_s: float | None) -> str:
    return "—" if not bytes_per_s else f"{format_size(int(bytes_per_s))}/s"


@register.filter
def eta_s(item) -> float | None:
    """Seconds left for a transfer in progress (a DataInput or an OutputTransfer), from its rate so far."""
    total = getattr(item, "bytes_total", None) or getattr(item, "bytes", 0)
    if getattr(item, "stage_state", "staging") != "staging" or not item.rate_bytes_s:
        return None
    return max(0.0, (total - item.bytes_done) / item.rate_bytes_s)


@register.simple_tag
def stage_cache_policy() -> dict:
    """What the page states plainly: the configured capacity and retention (E31 publishes neither)."""
    return {"capacity": settings.E31_STAGE_CACHE_BYTES, "retention_s": settings.E31_STAGE_RETENTION_S}


@register.simple_tag
def job_deliveries(job) -> list:
    """The current attempt's delivery rows (one per node part), oldest part first."""
    return list(job.output_transfers.filter(allocation__attempt=job.attempt))
