"""`e31 logs`: the whole log, however many reads it takes, with or without --follow."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from e31cli import main
from jobs import logs
from jobs.models import Allocation, Job
from tests.cli.inprocess import e31
from tests.factories import JobFactory, NodeFactory

LONG_LOG = "".join(f"step {i}\n" for i in range(150_000)).encode()  # ~1.8 MB: two reads of a megabyte


def job_with_long_log(team, member, *, finished: bool):
    job = JobFactory(team=team, submitted_by=member, state="running", attempt=1)
    Allocation.objects.create(
        job=job, attempt=1, node=NodeFactory(), gpu_indices=[0], rented_at=timezone.now(),
        finished_at=timezone.now() if finished else None,
    )  # fmt: skip
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=LONG_LOG)
    return job


@pytest.mark.django_db
def test_e31_logs_follow_prints_the_whole_of_a_finished_log_longer_than_one_read(
    monkeypatch, team, member, member_token
):
    job = job_with_long_log(team, member, finished=True)
    code, stdout, stderr = e31(monkeypatch, member_token, "logs", str(job.id), "--follow")
    assert code == 0, stderr
    assert stdout.encode() == LONG_LOG


@pytest.mark.django_db
@pytest.mark.parametrize("finished", [True, False], ids=["finished", "running"])
def test_e31_logs_without_follow_prints_the_whole_log_so_far_past_the_first_read(
    monkeypatch, team, member, member_token, finished
):
    job = job_with_long_log(team, member, finished=finished)
    code, stdout, stderr = e31(monkeypatch, member_token, "logs", str(job.id))
    assert code == 0, stderr
    assert stdout.encode() == LONG_LOG


@pytest.mark.django_db
@pytest.mark.parametrize("follow", [[], ["--follow"]], ids=["whole", "follow"])
def test_e31_logs_of_a_log_removed_by_retention_says_so_and_exits_as_not_found(
    monkeypatch, team, member, member_token, follow
):
    """A script reading the log must not take the removal note for an empty log (exit 0)."""
    job = job_with_long_log(team, member, finished=True)
    ended = timezone.now() - timedelta(days=2)
    Job.objects.filter(id=job.id).update(state="released", end_reason="succeeded", state_changed_at=ended)
    assert logs.prune_logs(now=timezone.now(), keep_days=1) == 1
    code, stdout, stderr = e31(monkeypatch, member_token, "logs", str(job.id), *follow)
    assert code == main.EXIT_NOT_FOUND
    assert stdout == "" and "The log was removed on" in stderr


class BusyConsole:
    """Answers a follow as the API does while every waiting slot is taken, then with the log's end."""

    def __init__(self, busy: int) -> None:
        self.busy, self.calls = busy, 0

    def get(self, path, **params):
        self.calls += 1
        if self.calls <= self.busy:
            return {"attempt": 1, "next_offset": 0, "text": "", "complete": False, "retry_after_s": 2.0}
        return {"attempt": 1, "next_offset": 3, "text": "ok\n", "complete": True, "retry_after_s": 0.0}


def test_a_follower_told_the_console_is_busy_waits_as_asked_before_asking_again(monkeypatch, capsys):
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    main._print_log(BusyConsole(busy=50), 1, follow=True)
    assert capsys.readouterr().out == "ok\n"
    assert slept == [2.0] * 50  # not 51 requests in a burst at a console short of threads


HOSTILE = "ok \x1b[1;32mgreen\x1b[0m\tstep 1\rstep 2\n\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b]0;title\x07\x9b31m\x1bc\x08end\n"


@pytest.mark.django_db
def test_e31_logs_on_a_terminal_keeps_colours_and_refuses_the_job_any_other_control(
    monkeypatch, team, member, member_token
):
    """A job's log is the job's text: printed raw on a terminal, a job could write to the follower's clipboard
    (OSC 52), retitle the window, reset the terminal or erase what came before. Colours, tabs and carriage
    returns (progress bars) stay; every other control character is shown as U+FFFD."""
    job = JobFactory(team=team, submitted_by=member, state="running", attempt=1)
    Allocation.objects.create(job=job, attempt=1, node=NodeFactory(), gpu_indices=[0], rented_at=timezone.now(),
                              finished_at=timezone.now())  # fmt: skip
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=HOSTILE.encode())
    monkeypatch.setattr(main, "_stdout_is_terminal", lambda: True)
    code, stdout, stderr = e31(monkeypatch, member_token, "logs", str(job.id))
    assert code == 0, stderr
    assert stdout == (
        "ok \x1b[1;32mgreen\x1b[0m\tstep 1\rstep 2\n\ufffd]52;c;ZWNobyBwd25lZA==\ufffd\ufffd]0;title\ufffd\ufffd31m\ufffdc\ufffdend\n"
    )


@pytest.mark.django_db
def test_e31_logs_piped_prints_the_log_as_the_job_wrote_it(monkeypatch, team, member, member_token):
    job = JobFactory(team=team, submitted_by=member, state="running", attempt=1)
    Allocation.objects.create(job=job, attempt=1, node=NodeFactory(), gpu_indices=[0], rented_at=timezone.now(),
                              finished_at=timezone.now())  # fmt: skip
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=HOSTILE.encode())
    code, stdout, _ = e31(monkeypatch, member_token, "logs", str(job.id))
    assert code == 0 and stdout == HOSTILE
