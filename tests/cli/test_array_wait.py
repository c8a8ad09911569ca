"""`e31 submit ARRAY --wait` waits for every task, not the first: a script that runs the next step after it
must not start while tasks still run. It exits with the highest of the tasks' exit codes (0 only when every
task succeeded), as `sbatch --wait` does for an array, and says which tasks did not succeed."""

import pytest

from e31cli import main
from jobs.models import Job
from tests.cli.inprocess import e31
from tests.cli.test_array_submit import array_file as sweep_file

pytestmark = pytest.mark.django_db


@pytest.fixture
def array_file(tmp_path, roots, pool):
    return sweep_file(tmp_path, roots, "0-3")


def _end(index: int, *, exit_code: int = 0, delivery: str = "delivered") -> None:
    Job.objects.filter(name="sweep", array_index=index).update(
        state="released", end_reason="succeeded" if exit_code == 0 else "failed", exit_code=exit_code,
        delivery_state=delivery,
    )  # fmt: skip


def _ending_one_task_per_poll(monkeypatch, plan):
    """Each poll's pause ends the next task of ``plan`` (index, exit code); returns how many polls slept."""
    polls = []

    def sleep(_seconds):
        if len(polls) < len(plan):
            index, exit_code = plan[len(polls)]
            _end(index, exit_code=exit_code)
        polls.append(1)
        if len(polls) > 50:
            raise AssertionError("still waiting after every task ended")

    monkeypatch.setattr(main.time, "sleep", sleep)
    return polls


def test_wait_on_an_array_returns_only_when_every_task_has_ended(monkeypatch, member_token, array_file):
    polls = _ending_one_task_per_poll(monkeypatch, [(0, 0), (1, 0), (2, 0), (3, 0)])
    code, _, err = e31(monkeypatch, member_token, "submit", str(array_file), "--wait")
    assert code == 0, err
    assert set(Job.objects.filter(name="sweep").values_list("state", flat=True)) == {"released"}
    assert len(polls) >= 4  # it slept until the last task ended, not only the first
    assert "4 of 4 tasks ended: 4 succeeded" in err


def test_an_array_exits_with_its_highest_task_exit_code_and_names_the_tasks_that_failed(
    monkeypatch, member_token, array_file
):
    _ending_one_task_per_poll(monkeypatch, [(0, 0), (1, 3), (2, 0), (3, 2)])
    code, _, err = e31(monkeypatch, member_token, "submit", str(array_file), "--wait")
    assert code == 3, err
    assert "2 succeeded, 2 failed" in err and "tasks 1 (exit 3), 3 (exit 2)" in err


def test_an_array_is_not_done_while_a_task_still_delivers_its_outputs(monkeypatch, member_token, array_file):
    polls = []

    def sleep(_seconds):
        polls.append(1)
        if len(polls) == 1:
            for index in range(4):
                _end(index, delivery="delivering" if index == 2 else "delivered")
        elif len(polls) == 3:
            _end(2)
        if len(polls) > 50:
            raise AssertionError("still waiting after every delivery ended")

    monkeypatch.setattr(main.time, "sleep", sleep)
    code, _, err = e31(monkeypatch, member_token, "submit", str(array_file), "--wait")
    assert code == 0, err
    assert len(polls) >= 3  # every task had ended after the first poll; task 2 delivered after the third


def test_a_task_killed_by_a_signal_or_whose_outputs_were_not_delivered_is_no_success(
    monkeypatch, member_token, array_file
):
    """A signal's exit code is negative in the job (-9): the array must not exit 0 by taking the max."""

    def sleep(_seconds):
        for index in (0, 2):
            _end(index)
        _end(1, exit_code=-9)
        _end(3, delivery="failed")

    monkeypatch.setattr(main.time, "sleep", sleep)
    code, _, err = e31(monkeypatch, member_token, "submit", str(array_file), "--wait")
    assert code == 137, err  # 128 + SIGKILL, as the shell reports it
    assert "2 succeeded, 1 delivery failed, 1 failed" in err and "tasks 1 (exit 137), 3 (exit 74)" in err


def test_a_task_run_again_during_the_wait_does_not_hide_a_failed_one(monkeypatch, member_token, array_file):
    """The tasks were listed with ?array= (which also lists their re-runs), newest first and only as many as
    the array's size: a teammate's re-run of task 2 pushed the failed task 0 off the list, and `--wait` exited 0
    with "4 of 4 tasks ended: 4 succeeded"; the next step of a pipeline ran on failed input."""
    from django.test import Client

    api = Client(headers={"Authorization": f"Bearer {member_token}"})
    polls = []

    def sleep(_seconds):
        polls.append(1)
        if len(polls) == 1:
            _end(0, exit_code=3)
            _end(1)
            _end(2)
            task_2 = Job.objects.get(name="sweep", array_index=2, rerun_of__isnull=True)
            assert api.post(f"/api/v1/jobs/{task_2.id}/rerun").status_code == 201
        elif len(polls) == 2:
            _end(3)
            _end(2)  # the re-run of task 2 as well
        assert len(polls) < 20, "the wait never ended"

    monkeypatch.setattr(main.time, "sleep", sleep)
    code, _, err = e31(monkeypatch, member_token, "submit", str(array_file), "--wait")
    assert code == 3, err
    assert "4 of 4 tasks ended: 3 succeeded, 1 failed; not succeeded: tasks 0 (exit 3)" in err
