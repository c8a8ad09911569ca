"""Charts read true: the y axis runs from 0 to a figure above 0, no label falls off the edge, and
a day of almost nothing is not drawn as a full-height bar labelled 0.0."""

import re
from datetime import UTC, datetime, timedelta

import pytest

from common import scales
from metering import reports
from operations import charts

START = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("peak", "ceiling"), [(0.014, 0.02), (0.2, 0.2), (3.4, 5), (7, 10), (12, 20), (1_234, 2_000), (0.0, 0.0)]
)
def test_a_scale_ends_at_the_next_round_figure(peak, ceiling):
    assert scales.nice_ceiling(peak) == pytest.approx(ceiling)


@pytest.mark.parametrize(("value", "text"), [(0.02, "0.02"), (2.5, "2.5"), (2000, "2,000"), (0, "0")])
def test_a_figure_is_written_with_the_digits_it_needs(value, text):
    assert scales.figure(value) == text


def _team_chart(values: dict[int, float]) -> str:
    slots = list(range(0, 60 * 24, 60))
    return charts.stacked_columns(
        slots=slots, series=[charts.Series("vision", "team-c0", values)], slot_label=str,
        tick=lambda m: f"{m // 60:02d}:00 UTC", unit="GPU-h", title="GPU-hours by team",
    )  # fmt: skip


def _y_labels(svg: str) -> list[str]:
    return re.findall(
        r'<text class="chart-label" x="[\d.]+" y="[\d.]+" text-anchor="end">([^<]*)</text>', svg
    )


def test_a_small_total_does_not_read_0_at_both_ends_of_the_axis():
    top, bottom = _y_labels(_team_chart({60: 0.014}))
    assert (top, bottom) == ("0.02", "0")


def test_the_last_x_label_stays_inside_the_chart():
    svg = _team_chart({60: 2.0})
    width = float(re.search(r'viewBox="0 0 (\d+)', svg).group(1))
    for x, anchor, text in re.findall(
        r'<text class="chart-tick" x="([\d.]+)"[^>]*?(?:text-anchor="(\w+)")?[^>]*>([^<]*)<', svg
    ):
        right = float(x) + (0 if anchor == "end" else len(text) * 6.5 / (2 if anchor == "middle" else 1))
        assert right <= width, f"{text!r} at x={x} ({anchor or 'start'}) runs past {width}"


def _days(hours: dict[int, float]) -> list[reports.Bucket]:
    return [
        reports.Bucket(START + timedelta(days=d), int(hours.get(d, 0) * reports.MICROS_PER_HOUR))
        for d in range(30)
    ]


def test_a_day_of_almost_nothing_is_no_full_height_bar_labelled_zero():
    chart = reports.day_chart(_days({4: 0.014}))
    plot = chart.baseline - 12
    assert chart.peak != "0.0" and float(chart.peak) > 0
    assert max(bar.height for bar in chart.bars) < plot


def test_an_empty_month_draws_no_bar():
    chart = reports.day_chart(_days({}))
    assert all(bar.height == 0 for bar in chart.bars) and chart.peak == "0"
