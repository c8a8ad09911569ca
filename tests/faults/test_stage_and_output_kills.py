"""SIGKILL the process doing the work while a job stages its data, and while it seals its outputs:
the reconciler re-drives the job and it resumes or ends cleanly; nothing is left stuck."""

import time

import pytest
from django.utils import timezone

from jobs.models import Allocation, DataInput, Job
from tests.e2e.conftest import wait_for_state
from tests.faults.conftest import assert_settled, py, start_worker, submit, wait_until_registered

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.timeout(240)]
BIG = 300 * 2**20  # sparse on disk; copying or hashing it still takes long enough to be caught in the act


def poll_until(rows, what: str, *, timeout: float = 60) -> None:
    """Polls every 10 ms (a state can last well under a second) until ``rows`` exist."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if rows.exists():
            return
        time.sleep(0.01)
    raise AssertionError(f"never saw {what}")


def test_a_control_worker_killed_while_staging_a_300_mb_input_is_re_driven_and_the_job_runs(
    live_pool, member, settings
):
    source = settings.E31_DATA_ROOTS[0] / "vision" / "big.bin"
    source.parent.mkdir(exist_ok=True)
    with open(source, "wb") as f:
        f.truncate(BIG)
    data = [{"name": "big", "uri": f"file://{source}", "bytes": BIG}]
    code = "import os; print('staged', os.path.getsize(os.environ['E31_DATA_DIR'] + '/big'))"
    job = submit(member, py(code), data=data, name="stage-kill")
    poll_until(DataInput.objects.filter(job=job, stage_state="staging"), what="the copy start")
    live_pool.kill("worker")  # mid-copy: the input is being copied into the staging cache
    caught = DataInput.objects.get(job=job)
    state_at_kill = Job.objects.get(id=job.id).state
    start_worker(live_pool)
    job = wait_for_state(job.id, "released", timeout=90)
    print(
        f"\nworker SIGKILL during STAGING: 1 trial; at the kill the job was {state_at_kill}, input "
        f"{caught.stage_state or 'not started'} at {caught.bytes_done} of {BIG} bytes; "
        f"afterwards {job.end_reason}, {list(job.events.values_list('to_state', flat=True))}"
    )
    assert state_at_kill == "staging"
    assert job.end_reason == "succeeded", job.end_detail
    assert f"staged {BIG}" in job.log_tail
    assert_settled([job.id])


def test_an_agent_killed_while_sealing_a_300_mb_output_leaves_the_job_requeued_and_finished(
    live_pool, member
):
    code = f"import os; open(os.environ['E31_OUTPUT_DIR'] + '/big.out', 'wb').truncate({BIG})"
    job = submit(member, py(code), requeue=True, name="output-kill", output_bytes=BIG)
    poll_until(Job.objects.filter(id=job.id, state="output"), what="OUTPUT")
    node = Allocation.objects.get(job=job, attempt=1).node.name
    killed_at = timezone.now()
    live_pool.kill(node)
    state_at_kill = Job.objects.get(id=job.id).state
    live_pool.start_agent(node)
    wait_until_registered(node, after=killed_at)
    job = wait_for_state(job.id, "released", timeout=90)
    first = Allocation.objects.get(job=job, attempt=1)
    print(
        f"\nagent SIGKILL during OUTPUT: 1 trial; at the kill the job was {state_at_kill}; attempt 1 "
        f"released (its run had ended {first.end_reason}), the job {job.end_reason} after {job.attempt} attempt(s)"
    )
    assert state_at_kill == "output"
    # Its process had ended well, but its outputs were never sealed: the attempt is lost with its node.
    assert first.released_at is not None
    assert job.events.filter(to_state="queued", reason__startswith="requeued").exists()
    assert (job.end_reason, job.attempt) == ("succeeded", 2)
    assert list(job.output_files.filter(attempt=2).values_list("bytes", flat=True)) == [BIG]
    assert_settled([job.id])
