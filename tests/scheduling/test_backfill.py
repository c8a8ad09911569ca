"""Backfilling never delays the reserved job; the starvation bound holds against a flood."""

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.scheduling import baselines, policy, simulate
from jobs.scheduling.traces import TraceJob
from jobs.scheduling.types import PolicyConfig

HOUR = 3600.0


@st.composite
def workloads(draw):
    """Small random workloads on 4-GPU nodes; run time never exceeds the declared limit."""
    n = draw(st.integers(3, 12))
    jobs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0, 0, 60, 600, 1800]))
        hours = draw(st.sampled_from([0.25, 0.5, 1, 2, 4]))
        run = hours * HOUR * draw(st.sampled_from([0.1, 0.5, 0.9, 1.0]))
        jobs.append(TraceJob(i, t, run, draw(st.integers(1, 8)), hours, draw(st.sampled_from("ab"))))
    return jobs, draw(st.integers(2, 3))


def _replay_recording(jobs, nodes, policy_fn, config):
    """Replay and record every reservation of the top waiting job: (job index, start_at)."""
    promised: list[tuple[int, float]] = []

    def record(now, result):
        if result.reservations:
            promised.append((result.reservations[0].job_id, result.reservations[0].start_at))

    outcomes = simulate.replay(
        jobs, nodes=nodes, gpus_per_node=4, policy=policy_fn, config=config, on_plan=record
    )
    return outcomes, promised


# Fair share and length off: the order stays first-come-first-served, so the top job stays on top.
FIXED_ORDER = PolicyConfig(
    fairshare_weight=0.0, length_weight=0.0, slowdown_weight=0.0, starvation_factor=0.0, explain=False
)


@settings(max_examples=80, deadline=None)
@given(workloads())
def test_backfill_never_delays_the_reserved_job(workload):
    jobs, nodes = workload
    for policy_fn in (policy.plan, policy.easy_nodes, baselines.easy):
        outcomes, promised = _replay_recording(jobs, nodes, policy_fn, FIXED_ORDER)
        for job_id, start_at in promised:
            assert outcomes[job_id].start <= start_at + 1e-6, (policy_fn.__name__, job_id)


@settings(max_examples=40, deadline=None)
@given(workloads())
def test_every_job_eventually_runs_and_no_gpu_is_held_twice(workload):
    jobs, nodes = workload  # the simulator asserts that starts only use free GPUs
    outcomes = simulate.replay(jobs, nodes=nodes, gpus_per_node=4, policy=policy.plan)
    assert all(not math.isnan(o.start) and o.start >= o.job.submit_s for o in outcomes)


def _flood(*, days: float = 4.0) -> list[TraceJob]:
    """A 16-GPU job declaring 12 h against 1-hour 2-GPU jobs that more than fill 2 x 8 GPUs."""
    jobs = [TraceJob(0, 600.0, 2 * HOUR, 16, 12.0, "big")]
    t, i = 0.0, 1
    while t < days * 24 * HOUR:
        jobs.append(TraceJob(i, t, HOUR, 2, 1.0, f"small-{i % 3}"))
        t, i = t + 225.0, i + 1  # 32 GPU-h offered per hour to a 16-GPU pool: the queue only grows
    jobs.sort(key=lambda j: j.submit_s)
    return [TraceJob(k, j.submit_s, j.run_s, j.gpus, j.declared_hours, j.team) for k, j in enumerate(jobs)]


LENGTH_ONLY = PolicyConfig(
    fairshare_weight=0.0,
    age_weight=0.0,
    slowdown_weight=0.0,
    starvation_s=math.inf,
    starvation_factor=0.0,
    explain=False,
)


def _big_wait(config: PolicyConfig) -> float:
    jobs = _flood()
    outcomes = simulate.replay(jobs, nodes=2, gpus_per_node=8, policy=policy.plan, config=config)
    big = next(o for o in outcomes if o.job.gpus == 16)
    return big.start - big.job.submit_s


def test_the_starvation_bound_holds_against_a_flood_of_small_jobs():
    # Age and fair share off, so only the bound can help: the short jobs always win on length.
    bound = 12 * HOUR
    wait = _big_wait(dataclasses.replace(LENGTH_ONLY, starvation_s=bound))
    assert wait <= bound + HOUR  # the bound, plus draining the 1-hour jobs already running


def test_without_the_bound_the_flood_starves_the_big_job():
    wait = _big_wait(LENGTH_ONLY)
    assert wait > 3 * 24 * HOUR  # so the test above is really adversarial


def test_age_alone_also_bounds_the_wait():
    wait = _big_wait(
        PolicyConfig(
            fairshare_weight=0.0,
            slowdown_weight=0.0,
            starvation_s=math.inf,
            starvation_factor=0.0,
            explain=False,
        )
    )
    # After ~1.15 days of age it outranks every newer short job; those submitted before then
    # (offered at twice the pool's rate) take ~2.3 days to run. Finite, whatever the flood's length.
    assert wait <= 2.5 * 24 * HOUR


# The small trace of issue 16: A holds 4 of 6 GPUs until 100 s; the head B needs 4, so EASY
# reserves the 4 GPUs A releases at 100 s and leaves the 2 idle ones to backfill: C (2 GPUs,
# long) starts at once. The engine used to reserve 2 released + 2 idle GPUs and keep C waiting.
SMALL_TRACE = [
    TraceJob(0, 0.0, 100.0, 4, 100 / HOUR, "t"),
    TraceJob(1, 1.0, 100.0, 4, 100 / HOUR, "t"),
    TraceJob(2, 2.0, 500.0, 2, 500 / HOUR, "t"),
]


@pytest.mark.parametrize(("nodes", "gpus_per_node"), [(6, 1), (3, 2)])
@pytest.mark.parametrize("name", ["easy", "easy-nodes", "default"])
def test_a_reservation_takes_gpus_released_at_its_time_before_idle_ones(name, nodes, gpus_per_node):
    outcomes = simulate.replay(
        SMALL_TRACE, nodes=nodes, gpus_per_node=gpus_per_node, policy=simulate.POLICIES[name]
    )
    assert [o.start for o in outcomes] == [0.0, 100.0, 2.0]


# Short backfill jobs return their GPUs before the reservation, so they must not shrink what longer
# candidates may use. 6 GPUs: A holds 4 until 100 s; the head B needs 5 then (1 extra GPU). C (1
# GPU, ends by 52 s) backfills on an idle GPU; D (1 GPU, long) still fits the extra one. The engine
# used to count C's GPU against the reservation and keep D waiting until 100 s.
WINDOW_TRACE = [
    TraceJob(0, 0.0, 100.0, 4, 100 / HOUR, "t"),
    TraceJob(1, 1.0, 100.0, 5, 100 / HOUR, "t"),
    TraceJob(2, 2.0, 50.0, 1, 50 / HOUR, "t"),
    TraceJob(3, 3.0, 500.0, 1, 500 / HOUR, "t"),
]


@pytest.mark.parametrize("name", ["easy", "easy-nodes", "default"])
def test_a_short_backfill_job_does_not_shrink_the_window_of_a_long_one(name):
    outcomes = simulate.replay(WINDOW_TRACE, nodes=6, gpus_per_node=1, policy=simulate.POLICIES[name])
    assert [o.start for o in outcomes] == [0.0, 100.0, 2.0, 3.0]


def test_the_default_relative_bound_still_ends_a_flood_at_its_ceiling():
    wait = _big_wait(simulate.REPLAY_CONFIG)
    assert wait <= simulate.REPLAY_CONFIG.starvation_max_s + HOUR


def test_a_starved_elastic_job_whose_full_size_never_fits_is_reserved_the_most_it_can_hold():
    """Reproduction: 8+8+2+2 GPUs, every one busy; a job asking 20 GPUs, at least 8, waited 30 days: placement
    found 20 GPUs never fit (two whole nodes and 4 on another), so the job took no reservation, the only one went
    to a new 1-GPU job of the heaviest team, and the job was told a start it never got (72 hours of 1-GPU jobs
    later it had not started)."""
    from jobs.scheduling.types import NodeView, PendingJob, RunningView

    now, hour = 1_780_000_000.0, 3600.0
    nodes = [NodeView(name=f"big{i}", gpus=8, free=()) for i in range(2)]
    nodes += [NodeView(name=f"small{i}", gpus=2, free=()) for i in range(2)]
    running = [
        RunningView(job_id=100 + n * 8 + g, team="busy", gpus_by_node={node.name: (g,)}, started_at=now - hour,
                    expected_end=now + 600 + 60 * ((100 + n * 8 + g) * 7 % 50))
        for n, node in enumerate(nodes) for g in range(node.gpus)
    ]  # fmt: skip
    elastic = PendingJob(
        job_id=1, team="elastic", gpus=20, min_gpus=8, hours=10, submitted_at=now - 30 * 24 * hour
    )
    small = [
        PendingJob(job_id=1000 + i, team="busy", gpus=1, hours=1, submitted_at=now - 60) for i in range(40)
    ]

    plan = policy.plan(now=now, nodes=nodes, running=running, pending=[elastic, *small],
                       usage={"busy": 1e6, "elastic": 0}, shares={})  # fmt: skip

    first = plan.reservations[0]
    assert first.job_id == 1 and sum(map(len, first.gpus_by_node.values())) == 18  # 2 whole nodes and 2 more
    assert plan.estimates[1].start_at <= first.start_at  # it starts with what is free once 8 are
