"""Pausable jobs for real: a reservation preempts a checkpointing job, which resumes on the other node."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from jobs import checkpoints, declaration, services
from jobs.models import Allocation, Job, JobEvent
from metering.models import MeterEntry
from tests.e2e.conftest import wait_for, wait_for_state
from tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
STEPS = 120  # 0.1 s each: long enough to be preempted part-way, short enough to finish in the test

# Counts to STEPS, adding each step to a total; keeps (step, total) in its checkpoint directory and
# starts from there when resumed. HANDLE decides what USR1 does; EVERY how often it saves by itself.
TRAINER = """
import os, pathlib, signal, sys, time
state = pathlib.Path(os.environ["E31_CHECKPOINT_DIR"]) / "state"
step, total = map(int, state.read_text().split()) if state.exists() else (0, 0)
start = step
print("attempt", os.environ["E31_ATTEMPT"], "resumed", os.environ["E31_RESUMED"], "from", step, flush=True)
def save(*_):
    state.write_text(f"{step} {total}")
def checkpoint_and_exit(*_):
    save(); print("checkpointed at", step, flush=True); sys.exit(0)
signal.signal(signal.SIGUSR1, checkpoint_and_exit if HANDLE else signal.SIG_IGN)
while step < STEPS:
    step += 1; total += step; time.sleep(0.1)
    if EVERY and step % EVERY == 0:
        save()
out = pathlib.Path(os.environ["E31_OUTPUT_DIR"]) / "result.txt"
out.write_text(f"total={total} resumed_from={start} attempt={os.environ['E31_ATTEMPT']}")
"""


@pytest.fixture
def member(live_pool):
    return MembershipFactory(
        team=TeamFactory(name="vision", slug="vision"), user=UserFactory(username="alice")
    ).user


def submit(member, argv, *, name, checkpoint=None, gpus=4):
    team = member.memberships.first().team
    request = {"gpus": gpus, "hours": 1.0, **({"checkpoint": checkpoint} if checkpoint else {})}
    spec = declaration.validate(
        {"name": name, "work": {"argv": argv}, "request": request,
         "output": {"uri": f"file://{settings.E31_OUTPUT_ROOTS[0]}/{team.slug}/{name}", "bytes": 1000}},
        limits=services.pool_limits(team=team),
    )  # fmt: skip
    return services.submit_job(team=team, user=member, spec=spec, now=timezone.now())


def trainer(*, handle: bool, every: int) -> list[str]:
    return ["/usr/bin/python3", "-c", f"HANDLE, EVERY, STEPS = {handle}, {every}, {STEPS}\n{TRAINER}"]


def _preempted_by_a_reservation(member, job):
    """``job`` runs on one node; a job fills the other, then a reserved job needs ``job``'s node: it is
    preempted, and resumes on the other node once the filler ends."""
    job = wait_for_state(job.id, "running")
    wait_for(lambda: "from 0" in Job.objects.get(id=job.id).log_tail, what="the trainer to start")
    filler = submit(member, ["/usr/bin/python3", "-c", "import time; time.sleep(8)"], name="filler")
    wait_for_state(filler.id, "running")
    reserved = submit(member, ["/usr/bin/python3", "-c", "import time; time.sleep(120)"], name="reserved")
    wait_for_state(reserved.id, "running", timeout=60)
    return Allocation.objects.get(job=job, attempt=1), reserved


def _assert_resumed_and_metered(job, first):
    assert (job.end_reason, job.attempt) == ("succeeded", 2)
    second = Allocation.objects.get(job=job, attempt=2)
    assert second.node_id != first.node_id and second.rented_at >= first.released_at
    wait_for(lambda: Job.objects.get(id=job.id).delivered_at, what="delivery")
    result = (settings.E31_OUTPUT_ROOTS[0] / "vision" / "trainer" / f"{job.id}-2" / "result.txt").read_text()
    fields = dict(item.split("=") for item in result.split())
    assert (
        int(fields["total"]) == STEPS * (STEPS + 1) // 2
    )  # the right result, not a restart's nor a double count
    assert 0 < int(fields["resumed_from"]) < STEPS and fields["attempt"] == "2"
    assert f"attempt 2 resumed 1 from {fields['resumed_from']}" in job.log_tail
    # The ledger: two attempts, each its own held time exactly, nothing for the wait between them.
    for allocation in (first, second):
        allocation.refresh_from_db()
        held = wait_for(
            lambda a=allocation: MeterEntry.objects.filter(allocation=a).aggregate(us=Sum("microseconds"))[
                "us"
            ],
            what="the ledger rows",
        )
        assert held == (allocation.released_at - allocation.rented_at) // timedelta(microseconds=1)
    assert set(
        MeterEntry.objects.filter(allocation__job=job).values_list("allocation__attempt", flat=True)
    ) == {1, 2}
    paused = JobEvent.objects.get(job=job, to_state="queued", from_state="running")
    assert "paused with a checkpoint of" in paused.reason
    wait_for(lambda: not checkpoints.directory(job.id).exists(), what="the checkpoint to go with the job")


def test_a_checkpointing_job_is_preempted_by_a_reservation_and_resumes_on_another_node(live_pool, member):
    job = submit(
        member, trainer(handle=True, every=0), name="trainer", checkpoint={"signal": "USR1", "grace_s": 10}
    )
    first, reserved = _preempted_by_a_reservation(member, job)
    assert first.end_reason == "preempted" and first.node_id == Allocation.objects.get(job=reserved).node_id
    stopped = first.released_at - JobEvent.objects.get(job=job, reason__startswith="preemption requested").at
    assert stopped.total_seconds() < 8  # it checkpointed and exited on USR1, well inside its 10 s grace
    job = wait_for_state(job.id, "released", timeout=60)
    _assert_resumed_and_metered(job, first)


def test_a_job_that_ignores_its_signal_is_killed_after_the_grace_and_resumes_from_its_last_checkpoint(
    live_pool, member
):
    job = submit(
        member, trainer(handle=False, every=10), name="trainer", checkpoint={"signal": "USR1", "grace_s": 2}
    )
    first, _ = _preempted_by_a_reservation(member, job)
    requested = JobEvent.objects.get(job=job, reason__startswith="preemption requested").at
    assert (first.released_at - requested).total_seconds() >= 2  # the grace was given in full, then KILL
    job = wait_for_state(job.id, "released", timeout=60)
    _assert_resumed_and_metered(job, first)
    assert int(job.log_tail.split(" from ")[1].split()[0]) % 10 == 0  # where its last own checkpoint left it
