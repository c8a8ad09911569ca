"""The job page reads true at a glance: a finished job's timeline has no step still in progress, the
declared command shows where each argument begins and ends, and a run of seconds is not "0.0 h"."""

import html
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from jobs import presenters
from jobs.lifecycle import EndReason, State
from jobs.models import Job, JobEvent
from jobs.templatetags import e31
from tests.factories import JobFactory

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
LIFE = (
    (0, "", "submitted"), (1, "submitted", "staging"), (2, "staging", "queued"), (3, "queued", "rented"),
    (4, "rented", "running"), (9, "running", "output"), (10, "output", "released"),
)  # fmt: skip


def _events(moves) -> list[JobEvent]:
    return [JobEvent(from_state=a, to_state=b, at=T0 + timedelta(seconds=s)) for s, a, b in moves]


@pytest.mark.parametrize("end_reason", [EndReason.SUCCEEDED, EndReason.FAILED])
def test_a_released_job_s_timeline_shows_every_step_done_and_none_in_progress(end_reason):
    job = Job(state=State.RELEASED, end_reason=end_reason, attempt=1)
    steps = presenters.timeline(job, _events(LIFE), now=T0 + timedelta(minutes=5))
    assert [s.status for s in steps] == ["done"] * 7


def test_a_live_job_s_timeline_still_marks_where_it_is():
    job = Job(state=State.RUNNING, attempt=1)
    steps = presenters.timeline(job, _events(LIFE[:5]), now=T0 + timedelta(seconds=6))
    assert [s.status for s in steps] == ["done", "done", "done", "done", "current", "todo", "todo"]


def test_the_declared_command_is_shown_with_each_argument_quoted_where_it_needs_to_be():
    argv = ["/usr/bin/python3", "-c", "import time\nprint('a b')", ""]
    assert e31.shell_words(argv) == """/usr/bin/python3 -c "import time\nprint('a b')" ''"""
    assert e31.shell_words(["python", "train.py", "--epochs=3"]) == "python train.py --epochs=3"
    assert e31.shell_words(["sh", "-c", "echo hi"]) == "sh -c 'echo hi'"
    assert e31.shell_words(["sh", "-c", "echo \"$HOME\" 'x'"]) == """sh -c 'echo "$HOME" '"'"'x'"'"''"""


@pytest.mark.django_db
def test_the_job_page_shows_the_command_quoted_not_its_arguments_run_together(team, member_client):
    job = JobFactory(team=team, argv=["/usr/bin/python3", "-c", "print('a b')"])
    page = html.unescape(member_client.get(reverse("jobs:detail", args=[job.id])).content.decode())
    assert "/usr/bin/python3 -c \"print('a b')\"" in page


@pytest.mark.parametrize(
    ("hours", "shown"),
    [(0.01, "36.0 s"), (0.1, "6 min 00 s"), (0.75, "45 min 00 s"), (1.5, "1.5 h"), (2, "2 h")],
)
def test_a_planned_run_time_is_shown_as_a_duration_never_as_zero_hours(hours, shown):
    assert e31.hours_duration(hours) == shown
