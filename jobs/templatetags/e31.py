"""Small display filters shared by the console's templates."""

import shlex
from datetime import datetime, timedelta

from django import template
from django.template.defaultfilters import floatformat
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
def hours_duration(hours: float | None) -> str:
    """A run time in hours: "2 h", "1.5 h" from an hour up; under an hour as a duration ("6 min 00 s",
    "36.0 s"), so a learned run of seconds is never "0.0 h"."""
    if hours is None:
        return "—"
    if hours >= 1:
        return f"{floatformat(hours, -1)} h"
    return duration(float(hours) * 3600)


@register.filter
def shell_words(argv: list[str]) -> str:
    """The command as a shell would read it: an argument with a space, a quote or a line break is quoted,
    so the reader sees where each one begins and ends (the job itself never runs through a shell). One
    holding single quotes but nothing a shell expands in double quotes is double-quoted: ``"print('hi')"``
    reads better than ``'print('"'"'hi'"'"')'``."""
    return " ".join(_shell_word(arg) for arg in argv or [])


def _shell_word(arg: str) -> str:
    quoted = shlex.quote(arg)
    if quoted == arg or "'" not in arg or any(c in arg for c in '"$`\\!'):
        return quoted
    return f'"{arg}"'


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
