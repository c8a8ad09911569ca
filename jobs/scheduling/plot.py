"""A hand-written SVG of a simulator run: mean wait by size class, and utilisation over time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Protocol

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
WIDTH, PANEL_H, MARGIN = 760, 260, 56


class _Run(Protocol):
    start: float
    end: float
    gpu_seconds: float


def utilisation_series(outcomes: Sequence[_Run], *, pool_gpus: int, bins: int = 120) -> list[float]:
    """Busy fraction of the pool in ``bins`` equal slices from the first start to the last end.

    A run is spread evenly over its interval (GPU-seconds / duration), so a preempted-and-requeued
    job is approximated by its first start and final end.
    """
    t0, t1 = min(o.start for o in outcomes), max(o.end for o in outcomes)
    width = max((t1 - t0) / bins, 1e-9)
    busy = [0.0] * bins
    for o in outcomes:
        rate = o.gpu_seconds / max(o.end - o.start, 1e-9)
        first, last = int((o.start - t0) / width), min(int((o.end - t0) / width), bins - 1)
        for b in range(first, last + 1):
            lo, hi = max(o.start, t0 + b * width), min(o.end, t0 + (b + 1) * width)
            busy[b] += rate * max(hi - lo, 0.0)
    return [min(x / (pool_gpus * width), 1.0) for x in busy]


def write_svg(path: str, *, summary: Mapping, replays: Mapping[str, Sequence[_Run]], pool_gpus: int) -> None:
    """Two panels: grouped bars of mean wait (hours) per size class, and utilisation lines."""
    names = list(summary["policies"])
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{2 * PANEL_H + 3 * MARGIN}" '
        'font-family="sans-serif" font-size="12">',
        f'<text x="{MARGIN}" y="20" font-size="14">{escape(summary["trace"])}: '
        f"{summary['jobs']} jobs on {pool_gpus} GPUs</text>",
    ]
    parts += _wait_bars(summary, names, top=MARGIN)
    parts += _util_lines(replays, names, pool_gpus=pool_gpus, top=2 * MARGIN + PANEL_H)
    parts += _legend(names, y=2 * PANEL_H + 2.6 * MARGIN)
    parts.append("</svg>")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(parts))


def _wait_bars(summary: Mapping, names: list[str], *, top: float) -> list[str]:
    classes = ["1", "2-4", "5-8", ">8"]
    hours = {
        (n, c): summary["policies"][n]["by_size"][c]["mean_wait_s"] / 3600 for n in names for c in classes
    }
    peak = max(hours.values(), default=0.0) or 1.0
    plot_w, plot_h = WIDTH - 2 * MARGIN, PANEL_H - 30
    group_w = plot_w / len(classes)
    bar_w = group_w * 0.8 / max(len(names), 1)
    out = [f'<text x="{MARGIN}" y="{top - 8}">mean wait by job size (GPUs), hours; max {peak:.1f} h</text>']
    out.append(_axes(top, plot_h))
    for ci, c in enumerate(classes):
        x0 = MARGIN + ci * group_w + group_w * 0.1
        out.append(
            f'<text x="{x0 + group_w * 0.4:.1f}" y="{top + plot_h + 16}" text-anchor="middle">{escape(c)}</text>'
        )
        for ni, n in enumerate(names):
            h = plot_h * hours[(n, c)] / peak
            out.append(
                f'<rect x="{x0 + ni * bar_w:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w * 0.9:.1f}" '
                f'height="{h:.1f}" fill="{COLOURS[ni % len(COLOURS)]}"><title>{escape(n)} {escape(c)}: '
                f"{hours[(n, c)]:.2f} h</title></rect>"
            )
    return out


def _util_lines(
    replays: Mapping[str, Sequence[_Run]], names: list[str], *, pool_gpus: int, top: float
) -> list[str]:
    plot_w, plot_h = WIDTH - 2 * MARGIN, PANEL_H - 30
    out = [
        f'<text x="{MARGIN}" y="{top - 8}">utilisation over the replay (0 to 100%)</text>',
        _axes(top, plot_h),
    ]
    for ni, n in enumerate(names):
        series = utilisation_series(replays[n], pool_gpus=pool_gpus)
        step = plot_w / max(len(series) - 1, 1)
        points = " ".join(
            f"{MARGIN + i * step:.1f},{top + plot_h * (1 - u):.1f}" for i, u in enumerate(series)
        )
        out.append(
            f'<polyline points="{points}" fill="none" stroke="{COLOURS[ni % len(COLOURS)]}" stroke-width="1.5"/>'
        )
    return out


def _axes(top: float, plot_h: float) -> str:
    x1 = WIDTH - MARGIN
    return (
        f'<path d="M{MARGIN},{top} V{top + plot_h} H{x1}" fill="none" stroke="#444"/>'
        f'<text x="{MARGIN - 6}" y="{top + 4}" text-anchor="end">max</text>'
        f'<text x="{MARGIN - 6}" y="{top + plot_h}" text-anchor="end">0</text>'
    )


def _legend(names: list[str], *, y: float) -> list[str]:
    out = []
    for ni, n in enumerate(names):
        x = MARGIN + ni * 130
        out.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{COLOURS[ni % len(COLOURS)]}"/>')
        out.append(f'<text x="{x + 18}" y="{y}">{escape(n)}</text>')
    return out
