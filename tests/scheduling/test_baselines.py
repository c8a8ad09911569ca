"""The textbook baselines, checked job by job against a second, differently written simulator.

The second one steps a clock minute by minute over a flat pool and decides backfill by brute
force: a job backfills when, with it running, the head job's earliest start (found by trying every
minute against the estimated GPU profile) is no later than without it - the definition of EASY,
not its shadow-time shortcut. FCFS is checked against a ten-line loop.
"""

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.scheduling import baselines, policy, simulate
from jobs.scheduling.traces import TraceJob
from jobs.scheduling.types import (
    NodeView,
    PendingJob,
    PendingList,
    RunningList,
    RunningView,
    smallest_request,
)

MIN = 60.0


@st.composite
def flat_workloads(draw):
    """Small workloads in whole minutes on a flat pool; run time never exceeds the estimate."""
    capacity = draw(st.integers(2, 8))
    jobs, t = [], 0
    for i in range(draw(st.integers(2, 12))):
        t += draw(st.sampled_from([0, 0, 1, 5, 20]))
        est = draw(st.sampled_from([5, 15, 30, 60, 120]))
        run = max(1, math.floor(est * draw(st.sampled_from([0.2, 0.5, 1.0]))))
        gpus = draw(st.integers(1, capacity))
        jobs.append(TraceJob(i, t * MIN, run * MIN, gpus, est / 60.0, "t"))
    return jobs, capacity


def _used(jobs, starts, t, *, projected_at=None):
    """GPUs busy at minute ``t``: by run times, or (``projected_at`` = now) as foreseen at that
    minute - jobs still running then are expected to hold their GPUs for their whole estimate."""
    busy = 0
    for j in jobs:
        s = starts.get(j.job_id)
        if s is None:
            continue
        run = j.run_s / MIN
        if projected_at is not None:
            if s + run <= projected_at:
                continue  # already finished
            run = j.declared_hours * 60
        if s <= t < s + run:
            busy += j.gpus
    return busy


def _earliest(head, jobs, starts, now, capacity):
    """First minute >= now at which ``head`` fits for its whole estimate, by the estimated profile."""
    length = int(head.declared_hours * 60)
    t = now
    while True:
        if all(
            _used(jobs, starts, u, projected_at=now) + head.gpus <= capacity for u in range(t, t + length)
        ):
            return t
        t += 1


def stepped_easy(jobs, capacity, *, order_key):
    """EASY by brute force, one pass per minute; returns start minute per job id."""
    starts: dict[int, int] = {}
    now = 0
    while len(starts) < len(jobs):
        queue = sorted((j for j in jobs if j.submit_s / MIN <= now and j.job_id not in starts), key=order_key)
        free = capacity - _used(jobs, starts, now)
        while queue and queue[0].gpus <= free:
            starts[queue[0].job_id] = now
            free -= queue.pop(0).gpus
        if queue:
            head = queue[0]
            for j in queue[1:]:
                if j.gpus > free:
                    continue
                before = _earliest(head, jobs, starts, now, capacity)
                if _earliest(head, jobs, {**starts, j.job_id: now}, now, capacity) <= before:
                    starts[j.job_id] = now
                    free -= j.gpus
        now += 1
    return starts


def trivial_fcfs(jobs, capacity):
    """Each job, in submit order, at the first moment after the previous start that it fits."""
    starts, intervals, last = {}, [], 0.0
    for j in sorted(jobs, key=lambda j: (j.submit_s, j.job_id)):
        t = max(j.submit_s, last)
        for cand in sorted({t} | {e for _, e, _ in intervals if e > t}):
            if sum(g for s, e, g in intervals if s <= cand < e) + j.gpus <= capacity:
                break
        starts[j.job_id], last = cand, cand
        intervals.append((cand, cand + j.run_s, j.gpus))
    return starts


def _replay_starts(jobs, capacity, policy_fn, *, gpus_per_node=1):
    outcomes = simulate.replay(
        jobs, nodes=capacity // gpus_per_node, gpus_per_node=gpus_per_node, policy=policy_fn
    )
    return {o.job.job_id: o.start for o in outcomes}


def _by_submit(j):
    return (j.submit_s, j.job_id)


def _by_estimate(j):
    return (j.declared_hours, j.submit_s, j.job_id)


@settings(max_examples=60, deadline=None)
@given(flat_workloads())
def test_fcfs_equals_a_trivial_fcfs(workload):
    jobs, capacity = workload
    assert _replay_starts(jobs, capacity, baselines.fcfs) == trivial_fcfs(jobs, capacity)


@settings(max_examples=60, deadline=None)
@given(flat_workloads())
def test_easy_matches_the_brute_force_simulator_job_by_job(workload):
    jobs, capacity = workload
    expected = {k: v * MIN for k, v in stepped_easy(jobs, capacity, order_key=_by_submit).items()}
    assert _replay_starts(jobs, capacity, baselines.easy) == expected


@settings(max_examples=60, deadline=None)
@given(flat_workloads())
def test_sjf_easy_matches_the_brute_force_simulator_job_by_job(workload):
    jobs, capacity = workload
    expected = {k: v * MIN for k, v in stepped_easy(jobs, capacity, order_key=_by_estimate).items()}
    assert _replay_starts(jobs, capacity, baselines.sjf_easy) == expected


@settings(max_examples=60, deadline=None)
@given(flat_workloads())
def test_easy_keeps_its_reservation_uses_no_gpu_twice_and_starts_nothing_early(workload):
    jobs, capacity = workload
    promised: dict[int, float] = {}

    def record(now, plan):
        for r in plan.reservations:
            promised.setdefault(r.job_id, r.start_at)  # the first promise must hold

    outcomes = simulate.replay(jobs, nodes=capacity, gpus_per_node=1, policy=baselines.easy, on_plan=record)
    for o in outcomes:
        assert o.start >= o.job.submit_s
        if o.job.job_id in promised:
            assert o.start <= promised[o.job.job_id]
        busy = sum(p.job.gpus for p in outcomes if p.start <= o.start < p.end)
        assert busy <= capacity


@settings(max_examples=40, deadline=None)
@given(flat_workloads())
def test_the_engines_easy_equals_the_flat_reference_where_nodes_do_not_constrain(workload):
    jobs, capacity = workload
    assert _replay_starts(jobs, capacity, policy.easy_nodes) == _replay_starts(jobs, capacity, baselines.easy)


@pytest.mark.parametrize("largest", [None, 8])
def test_a_queue_that_vouches_for_no_width_it_knows_is_still_filtered_to_the_pool(largest):
    """A kept queue's facts skip the baselines' scans only when they prove the scan needless: an
    unknown widest job (None), or one wider than the pool, leaves the 8-GPU job out on 4 GPUs."""
    nodes = [NodeView(name="n0", gpus=4, free=(0, 1))]
    jobs = [PendingJob(1, "t", 8, 1.0, 0.0), PendingJob(2, "t", 1, 1.0, 1.0)]
    queue = PendingList(jobs)
    queue.by_submit = queue.ready = queue.ungated = True
    queue.largest = largest
    for plan_with in (baselines.fcfs, baselines.easy, baselines.sjf_easy):
        plan = plan_with(now=0.0, nodes=nodes, running=[], pending=queue, usage={}, shares={})
        assert [s.job_id for s in plan.starts] == [2], plan_with.__name__


@pytest.mark.parametrize(("small", "backfilled"), [(1, [1, 3]), (2, [1])])
def test_a_counted_queue_skips_only_the_backfill_that_cannot_fit(small, backfilled):
    """Lists counted as the replay counts them (queued jobs per size, each running job's GPUs): a
    pass with fewer GPUs free than the smallest request skips backfill (size 2, one GPU left). The
    count covers the whole queue (the head and this pass's starts too), so it is a lower bound:
    the plans are those of uncounted lists, and a 1-GPU short job still takes the last GPU."""
    nodes = [NodeView(name="n0", gpus=8, free=(0, 1, 2, 3, 4))]
    running = RunningList([RunningView(9, "t", {"n0": (5, 6, 7)}, 0.0, 7200.0)])
    running.held = [3]
    jobs = [
        PendingJob(1, "t", 4, 1.0, 0.0),
        PendingJob(2, "t", 8, 1.0, 1.0),
        PendingJob(3, "t", small, 0.5, 2.0),
    ]
    counted = PendingList(jobs)
    counted.by_submit = counted.ready = counted.ungated = True
    counted.sizes = Counter(j.gpus for j in jobs)
    assert smallest_request(counted) == small and smallest_request(jobs) == 1  # uncounted: no bound
    args = {"now": 0.0, "nodes": nodes, "usage": {}, "shares": {}}
    for plan_with in (baselines.easy, baselines.sjf_easy):
        kept = plan_with(pending=counted, running=running, **args)
        plain = plan_with(pending=list(jobs), running=list(running), **args)
        assert (kept.starts, kept.reservations) == (plain.starts, plain.reservations)
    plan = baselines.easy(pending=counted, running=running, **args)
    assert [s.job_id for s in plan.starts] == backfilled
    assert plan.reservations[0].job_id == 2 and plan.reservations[0].start_at == 7200.0
