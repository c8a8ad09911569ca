"""SIGKILL a node agent while its job runs, twenty times: the job is requeued or ends node_lost as it
declared, never holds two attempts at once, and every meter closes exactly."""

from collections import Counter

import pytest
from django.utils import timezone

from jobs.models import Allocation, Job, Node
from tests.e2e.conftest import wait_for, wait_for_state
from tests.faults.conftest import assert_settled, attempts_watched, py, submit, wait_until_registered

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.timeout(420)]
TRIALS = 20


def kill_during_run(pool, member, *, round_: int, wait_down: bool) -> dict[int, bool]:
    """One round, two trials: a 4-GPU job fills each of two nodes, one requeueing and one not; once
    both run, both agents are killed together, then come back. Returns {job id: requeue}."""
    jobs = {
        submit(member, py("import time; time.sleep(4)"), gpus=4, requeue=r, name=f"kill-{round_}-{r}").id: r
        for r in (True, False)
    }
    running = [wait_for_state(job_id, "running", timeout=60) for job_id in jobs]
    nodes = [Allocation.objects.get(job=job, released_at__isnull=True).node.name for job in running]
    killed_at = timezone.now()
    for node in nodes:
        pool.kill(node)
    if wait_down:  # the reaper's path: silent past the timeout, declared down, then the agent returns
        wait_for(
            lambda: Node.objects.filter(name__in=nodes, state="down").count() == 2, timeout=15, what="down"
        )
    for node in nodes:
        pool.start_agent(node)  # else the restart's own path: registering again loses the old attempts
    for node in nodes:
        wait_until_registered(node, after=killed_at)
    return jobs


def start_spare_agents(pool) -> None:
    """Four nodes: a round's requeued attempt runs on a spare while the next round fills two others."""
    started = timezone.now()
    spares = [f"e2e-{pool.tag}-{i}" for i in (3, 4)]
    for node in spares:
        pool.start_agent(node)
    for node in spares:
        wait_until_registered(node, after=started)


def test_twenty_agent_kills_during_run_requeue_or_end_node_lost_and_never_run_two_attempts_at_once(
    live_pool, member
):
    start_spare_agents(live_pool)
    declared: dict[int, bool] = {}
    with attempts_watched() as doubled:
        for round_ in range(TRIALS // 2):
            # The last round's requeued attempt is placed first, so each job of this round gets a node of its own.
            waiting = Job.objects.filter(id__in=list(declared), state="queued")
            wait_for(lambda q=waiting: not q.exists(), what="the last round's requeued attempt to start")
            declared |= kill_during_run(live_pool, member, round_=round_, wait_down=round_ % 2 == 0)
        jobs = [wait_for_state(job_id, "released", timeout=90) for job_id in declared]
    outcomes = Counter((declared[j.id], j.end_reason) for j in jobs)
    print(
        f"\nagent SIGKILL during RUN: {TRIALS} trials, {TRIALS // 2} with requeue on; outcomes "
        f"{dict((f'requeue={r} -> {e}', n) for (r, e), n in outcomes.items())}; "
        f"{len(doubled)} moments with two attempts held"
    )
    assert doubled == []
    for job in jobs:
        first = Allocation.objects.get(job=job, attempt=1)
        assert first.released_at is not None and first.end_reason == "node_lost", (job.id, first.end_reason)
        if declared[job.id]:
            assert (job.end_reason, job.attempt) == ("succeeded", 2), (job.id, job.end_reason, job.attempt)
        else:
            assert (job.end_reason, job.attempt) == ("node_lost", 1), (job.id, job.end_reason, job.attempt)
    assert_settled(declared)
    assert Job.objects.filter(id__in=declared, state="released").count() == TRIALS
