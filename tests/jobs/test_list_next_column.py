"""The job list's "next" column never cuts a word: a long reason is cut between words, whole in a tooltip."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

REASON = (
    "needs 8 GPUs on one node; waiting behind job 41 (higher priority, 8 GPUs); "
    "expected to start about 14:20 UTC on 2 Dec once the reservation on gpu-07 ends"
)


def _next_cell(html: str) -> re.Match:
    found = re.search(r'<td class="muted next"( title="([^"]*)")?>(.*?)</td>', html, re.S)
    assert found, "no next cell"
    return found


def test_a_long_reason_is_cut_between_words_and_shown_whole_in_a_tooltip(team, member_client):
    JobFactory(team=team, state="queued", pending_reason=REASON)
    cell = _next_cell(member_client.get(reverse("jobs:list")).content.decode())
    shown = cell.group(3).strip()
    assert shown.endswith("…") and len(shown) < len(REASON)
    kept = shown.removesuffix("…")
    assert REASON.startswith(kept) and REASON[len(kept)] in " ,;:"  # the cut falls after a whole word
    assert cell.group(2) == REASON


def test_a_short_reason_is_shown_whole_with_no_tooltip(team, member_client):
    JobFactory(team=team, state="queued", pending_reason="not enough idle GPUs yet")
    cell = _next_cell(member_client.get(reverse("jobs:list")).content.decode())
    assert cell.group(3).strip() == "not enough idle GPUs yet" and cell.group(1) is None


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ("submitted", "waits for job 41 to end (afterok), then stages its data"),
        ("staging", "staging its data: 40 GB of 120 GB in place"),
    ],
)
def test_a_job_waiting_before_the_queue_says_why_in_the_list_too(team, member_client, state, reason):
    """The column showed only queued jobs' reasons: a pipeline step held by its prerequisite, or a job staging,
    had an empty cell in the list while its page, the API and the CLI said why it waits."""
    JobFactory(
        team=team, state=state, pending_reason=reason, estimated_start=timezone.now() + timedelta(hours=2)
    )
    cell = _next_cell(member_client.get(reverse("jobs:list")).content.decode())
    assert reason in cell.group(3) and "starts ~" in cell.group(3)


@pytest.mark.parametrize("days_away", [0, 3])
def test_an_estimated_start_names_its_day_unless_it_is_today(team, member_client, days_away):
    """A member's queued job is estimated to start today, or in three days: the Next column says
    "starts ~14:20 UTC" for today and "starts ~Dec 8 14:20 UTC" for another day, as the queue page does."""
    now = timezone.now().replace(hour=12, minute=0, second=0, microsecond=0)
    start = now + timedelta(days=days_away, minutes=20)
    JobFactory(team=team, state="queued", estimated_start=start, pending_reason="waiting for 8 GPUs")
    cell = _next_cell(member_client.get(reverse("jobs:list")).content.decode()).group(3)
    day = f"{start:%b} {start.day} " if days_away else ""
    assert f"starts ~{day}{start:%H:%M} UTC" in cell
