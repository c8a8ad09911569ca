"""Small display filters shared by the console's templates."""

from datetime import datetime, timedelta

from django import template
from django.utils import dateformat, timezone
from django.utils.html import format_html

from common import links
from jobs import presenters
from jobs.units import format_size

register = template.Library()


@register.filter
def size(value) -> str:
    return format_size(value)


@register.filter
def duration(value: timedelta | float | None) -> str:
    """1 h 04 min, 12 min 03 s, 4.2 s."""
    if value is None:
        return "—"
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


@register.filter
def time_or_day(moment: datetime | None) -> str:
    """ "14:20" for a time today, "Dec 8 14:20" for another day (as the queue page writes it), in UTC."""
    if moment is None:
        return ""
    local = timezone.localtime(moment)
    today = timezone.localdate()
    return dateformat.format(local, "H:i" if local.date() == today else "M j H:i")


@register.filter
def gpu_hours(seconds: float | int | None) -> str:
    return "—" if seconds is None else f"{seconds / 3600:.3f}"


@register.filter
def cut_at_word(text: str, limit: int) -> str:
    """At most ``limit`` characters, cut between two words with an ellipsis; short text is returned whole."""
    if len(text) <= limit:
        return text
    head = text[: limit + 1].rsplit(" ", 1)[0] if " " in text[:limit] else text[:limit]
    return head.rstrip(" ,;:") + "…"


@register.filter
def percent(done, total) -> int:
    return 100 if not total else max(0, min(100, int(100 * (done or 0) / total)))


@register.filter
def in_words(reason: str) -> str:
    """An end reason as people write it: out_of_memory -> out of memory."""
    return (reason or "").replace("_", " ")


@register.simple_tag
def job_badge(job, *, with_id: bool = False) -> str:
    """The job's state while it lives, how it ended once it has, in words and a matching colour."""
    words, tone = presenters.outcome(job)
    if with_id:
        return format_html('<span class="badge {}" id="job-{}-badge">{}</span>', tone, job.id, words)
    return format_html('<span class="badge {}">{}</span>', tone, words)


@register.simple_tag
def href(name: str, pk: int | None = None) -> str:
    """``{% url name %}`` or ``{% url name pk %}`` for an integer pk, reversed once per name (common.links)."""
    return links.href(name, pk)
