"""Display helpers for staging and delivery: rates, ETAs, the cache's configured policy."""

from django import template
from django.conf import settings

from jobs import cache_fill, selectors
from jobs.units import format_size

register = template.Library()


@register.filter
def rate(bytes_per_s: float | None) -> str:
    return "—" if not bytes_per_s else f"{format_size(int(bytes_per_s))}/s"


@register.filter
def eta_s(item) -> float | None:
    """Seconds left for a transfer in progress (a DataInput or an OutputTransfer), from its rate so far."""
    return selectors.eta_s(item)


@register.simple_tag
def stage_cache_policy() -> dict:
    """What the page states plainly: the configured capacity and retention (E31 publishes neither)."""
    return {
        "capacity": settings.E31_STAGE_CACHE_BYTES,
        "team_share": cache_fill.team_share_bytes(),
        "retention_s": settings.E31_STAGE_RETENTION_S,
    }


@register.simple_tag
def job_deliveries(job) -> list:
    """The current attempt's delivery rows (one per node part), oldest part first."""
    return selectors.current_deliveries(job)
