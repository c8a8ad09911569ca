"""Server-rendered SVG charts: no script and no inline style (the CSP allows only our own files).

Each helper returns finished markup: the colours come from classes in ``static/css/app.css``, and
every mark carries a ``<title>`` so hovering shows its figure. Building the markup here rather
than in a template keeps a 30-day chart (hundreds of marks) to a few milliseconds.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from common import scales

TOP, BOTTOM, LEFT, RIGHT = 16.0, 22.0, 44.0, 8.0
TEAM_COLOURS = 12  # classes team-c0 .. team-c11


def team_css(team_id: int | None) -> str:
    """A stable colour class per team (teams beyond the palette share colours, not labels)."""
    return "team-none" if team_id is None else f"team-c{team_id % TEAM_COLOURS}"


@dataclass(frozen=True)
class Series:
    name: str
    css: str
    values: Mapping[int, float]  # slot -> value; a missing slot draws nothing


def stacked_columns(
    *, slots: Sequence[int], series: Sequence[Series], slot_label: Callable[[int], str], unit: str, title: str,
    tick: Callable[[int], str], width: int = 760, height: int = 220, ceiling: float | None = None,
) -> SafeString:  # fmt: skip
    """Columns per slot, the series stacked bottom-up in the given order, scaled to the tallest stack."""
    plot_w, plot_h = width - LEFT - RIGHT, height - TOP - BOTTOM
    tallest = ceiling or max((sum(s.values.get(t, 0.0) for s in series) for t in slots), default=0.0)
    peak = scales.nice_ceiling(tallest) or 1.0
    slot_w = plot_w / max(1, len(slots))
    marks = [
        _column(i, t, series, slot_w=slot_w, plot_h=plot_h, peak=peak, label=slot_label(t), unit=unit)
        for i, t in enumerate(slots)
    ]
    every = max(1, len(slots) // 6)
    ticks = [
        _tick(LEFT + i * slot_w, height, tick(t), right=width - RIGHT)
        for i, t in enumerate(slots)
        if i % every == 0
    ]
    return _svg(width, height, title, [*_axes(width, plot_h, peak, unit), *marks, *ticks])


TICK_CHAR_W = 6.5  # a 10px label's widest characters, to keep the last one inside the chart


def _tick(x: float, height: int, text: str, *, right: float) -> str:
    """A label starting at its slot, or ending at the chart's edge when it would run past it."""
    anchor = ""
    if x + len(text) * TICK_CHAR_W > right:
        x, anchor = right, ' text-anchor="end"'
    return f'<text class="chart-tick" x="{x:.1f}" y="{height - 6}"{anchor}>{escape(text)}</text>'


def _column(
    i: int, slot: int, series: Sequence[Series], *, slot_w: float, plot_h: float, peak: float, label: str, unit: str
) -> str:  # fmt: skip
    x, w = LEFT + i * slot_w, max(0.5, slot_w - 0.6)
    y = TOP + plot_h
    rects = []
    for s in series:
        value = s.values.get(slot)
        if not value:
            continue
        h = value / peak * plot_h
        y -= h
        rects.append(
            f'<rect class="{s.css}" x="{x:.2f}" y="{y:.2f}" width="{w:.2f}" height="{h:.2f}">'
            f"<title>{escape(label)}: {escape(s.name)} {value:,.1f} {escape(unit)}</title></rect>"
        )
    return "".join(rects)


def _axes(width: int, plot_h: float, peak: float, unit: str) -> list[str]:
    base = TOP + plot_h
    return [
        f'<line class="chart-axis" x1="{LEFT}" x2="{width - RIGHT}" y1="{base}" y2="{base}"></line>',
        f'<line class="chart-grid" x1="{LEFT}" x2="{width - RIGHT}" y1="{TOP}" y2="{TOP}"></line>',
        f'<text class="chart-label" x="{LEFT - 4}" y="{TOP + 4}" text-anchor="end">{scales.figure(peak)}</text>',
        f'<text class="chart-label" x="{LEFT - 4}" y="{base}" text-anchor="end">0</text>',
        f'<text class="chart-label" x="{LEFT}" y="{TOP - 4}">{escape(unit)}</text>',
    ]


def horizontal_bars(
    *, items: Sequence[tuple[str, float, str]], unit: str, title: str, width: int = 760
) -> SafeString:
    """One labelled bar per (label, value, css class), scaled to the largest value."""
    row, label_w = 22, 160.0
    height = max(1, len(items)) * row + 8
    peak = max((v for _, v, _ in items), default=0.0) or 1.0
    plot_w = width - label_w - 110
    marks = []
    for i, (label, value, css) in enumerate(items):
        y = 4 + i * row
        w = max(0.0, value) / peak * plot_w
        marks.append(
            f'<text class="chart-label" x="{label_w - 6}" y="{y + 14}" text-anchor="end">{escape(label)}</text>'
            f'<rect class="{css}" x="{label_w}" y="{y}" width="{w:.2f}" height="{row - 6}">'
            f"<title>{escape(label)}: {value:,.2f} {escape(unit)}</title></rect>"
            f'<text class="chart-label" x="{label_w + w + 6:.2f}" y="{y + 14}">{value:,.1f} {escape(unit)}</text>'
        )
    return _svg(width, height, title, marks)


def _svg(width: int, height: int, title: str, parts: Sequence[str]) -> SafeString:
    body = "".join(parts)
    # Safe: every text interpolated above went through escape().
    return mark_safe(
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img">'
        f"<title>{escape(title)}</title>{body}</svg>"
    )


def time_label(fmt: str) -> Callable[[int], str]:
    """A slot (whole minutes since the epoch) formatter, in UTC."""
    return lambda minute: datetime.fromtimestamp(minute * 60, UTC).strftime(fmt)
