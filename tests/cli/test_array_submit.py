"""`e31 submit` of an array prints the array's id alone on stdout, as a script needs it for `e31 ls --array` and
`e31 cancel --array`; stderr keeps the summary for a person."""

import pytest
import tomli_w

from e31cli import main
from jobs.models import Job
from tests.cli.inprocess import e31
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def array_file(tmp_path, roots, spec: str):
    _, out_root = roots
    raw = {
        "name": "sweep", "array": spec,
        "work": {"argv": ["python3", "sweep.py"]},
        "request": {"gpus": 1, "hours": 1.0},
        "output": {"uri": f"file://{out_root}/sweep", "bytes": 100},
    }  # fmt: skip
    path = tmp_path / "sweep.toml"
    path.write_text(tomli_w.dumps(raw))
    return path


def test_an_array_submission_prints_the_array_id_which_cancel_array_takes(
    monkeypatch, team, member_token, tmp_path, roots, pool
):
    """`A=$(e31 submit array.toml); e31 cancel --array $A` cancelled another array, or none ("No such array"):
    stdout was the first task's job id."""
    JobFactory.create_batch(3, team=team)  # job ids run ahead of array ids, as on a console in use
    code, stdout, stderr = e31(monkeypatch, member_token, "submit", str(array_file(tmp_path, roots, "0-3")))
    assert code == 0, stderr
    tasks = Job.objects.filter(name="sweep")
    array_id = tasks.first().array_id
    assert stdout == f"{array_id}\n"
    assert array_id not in set(tasks.values_list("id", flat=True)), "the test tells nothing if they coincide"
    assert f"array {array_id}: 4 tasks [0-3]" in stderr

    code, stdout, stderr = e31(monkeypatch, member_token, "cancel", "--array", stdout.strip())
    assert code == 0, stderr
    assert set(tasks.values_list("end_reason", flat=True)) == {"cancelled"}


def test_a_one_task_array_is_one_task(monkeypatch, member_token, tmp_path, roots, pool):
    code, stdout, stderr = e31(monkeypatch, member_token, "submit", str(array_file(tmp_path, roots, "5")))
    assert code == 0, stderr
    array_id = Job.objects.get(name="sweep").array_id
    assert stdout == f"{array_id}\n"
    assert f"array {array_id}: 1 task [5]" in stderr and "1 tasks" not in stderr


def test_a_rerun_of_one_task_prints_the_new_jobs_id(monkeypatch, member_token, tmp_path, roots, pool):
    """A task run again is kept as a one-task array of its index (it counts against its array's limit), but the
    user re-ran one job: `J=$(e31 submit --from ID); e31 logs $J` reads the new job's log."""
    e31(monkeypatch, member_token, "submit", str(array_file(tmp_path, roots, "0-1")))
    task = Job.objects.get(name="sweep", array_index=1)
    code, stdout, stderr = e31(monkeypatch, member_token, "submit", "--from", str(task.id))
    assert code == 0, stderr
    rerun = Job.objects.get(rerun_of=task)
    assert stdout == f"{rerun.id}\n"
    assert "1 tasks" not in stderr


def test_an_array_submission_with_wait_keeps_stdout_empty_as_a_single_jobs_does(
    monkeypatch, member_token, tmp_path, roots, pool
):
    """The outcome is the exit code and stderr's summary; stdout stays empty (with --follow it is the log)."""

    def sleep(_seconds):
        Job.objects.filter(name="sweep").update(
            state="released", end_reason="succeeded", exit_code=0, delivery_state="delivered"
        )

    monkeypatch.setattr(main.time, "sleep", sleep)
    code, stdout, stderr = e31(
        monkeypatch, member_token, "submit", str(array_file(tmp_path, roots, "0-1")), "--wait"
    )
    assert code == 0, stderr
    assert stdout == ""
    assert "2 of 2 tasks ended: 2 succeeded" in stderr
