"""The simulator reproduces hand-computed FCFS and EASY schedules, and computes its metrics as defined."""

import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.scheduling import baselines, policy, simulate
from jobs.scheduling.traces import TraceJob


def _jobs(rows):
    """Rows of (submit s, GPUs, run s); declared = run, one team."""
    return [TraceJob(i, s, r, g, r / 3600.0, "t") for i, (s, g, r) in enumerate(rows)]


def _starts(jobs, *, nodes, gpus_per_node, name):
    outcomes = simulate.replay(jobs, nodes=nodes, gpus_per_node=gpus_per_node, policy=simulate.POLICIES[name])
    return [o.start for o in outcomes]


# One node of 4 GPUs.
#   j0 t=0  2 GPUs 100 s   starts at 0
#   j1 t=10 4 GPUs  50 s   needs the whole node: after j0, at 100
#   j2 t=20 1 GPU   30 s   FCFS: behind j1, at 150. EASY: ends at 50 <= 100, backfills at 20
#   j3 t=30 2 GPUs 200 s   FCFS: with j2 at 150. EASY: would run past 100 on GPUs j1 needs: 150
ONE_NODE = _jobs([(0, 2, 100), (10, 4, 50), (20, 1, 30), (30, 2, 200)])


def test_fcfs_reproduces_the_hand_computed_schedule_on_one_node():
    assert _starts(ONE_NODE, nodes=1, gpus_per_node=4, name="fcfs") == [0, 100, 150, 150]


@pytest.mark.parametrize("name", ["easy", "easy-nodes"])
def test_easy_reproduces_the_hand_computed_schedule_on_one_node(name):
    assert _starts(ONE_NODE, nodes=1, gpus_per_node=4, name=name) == [0, 100, 20, 150]


# Two nodes of 4 GPUs (A, B).
#   j0 t=0 4 GPUs 100 s  -> A at 0
#   j1 t=0 2 GPUs 300 s  -> B at 0 (2 left on B)
#   j2 t=5 8 GPUs  10 s  -> both whole nodes: when j1 ends, 300
#   j3 t=6 2 GPUs  50 s  FCFS: behind j2, at 310. EASY: fits B now and ends at 56 <= 300: at 6
#   j4 t=7 4 GPUs 500 s  A is free at 100 but j2 counts on it at 300: both policies 310
TWO_NODES = _jobs([(0, 4, 100), (0, 2, 300), (5, 8, 10), (6, 2, 50), (7, 4, 500)])


def test_fcfs_reproduces_the_hand_computed_schedule_on_two_nodes():
    assert _starts(TWO_NODES, nodes=2, gpus_per_node=4, name="fcfs") == [0, 0, 300, 310, 310]


@pytest.mark.parametrize("name", ["easy", "easy-nodes"])
def test_easy_reproduces_the_hand_computed_schedule_on_two_nodes(name):
    assert _starts(TWO_NODES, nodes=2, gpus_per_node=4, name=name) == [0, 0, 300, 6, 310]


# Three nodes of 4 GPUs: a job wider than a node backfills too, on whole nodes.
#   j0 t=0 4 GPUs  100 s -> a node at 0
#   j1 t=1 12 GPUs  10 s -> all three nodes: 100
#   j2 t=2 8 GPUs   50 s -> FCFS: 110. EASY: two whole idle nodes, done by 52 <= 100: at 2
WIDE = _jobs([(0, 4, 100), (1, 12, 10), (2, 8, 50)])


@pytest.mark.parametrize("name", ["easy", "easy-nodes"])
def test_easy_backfills_a_job_wider_than_a_node(name):
    assert _starts(WIDE, nodes=3, gpus_per_node=4, name=name) == [0, 100, 2]
    assert _starts(WIDE, nodes=3, gpus_per_node=4, name="fcfs") == [0, 100, 110]


def test_sjf_starts_the_shortest_declared_job_first():
    jobs = _jobs([(0, 4, 100), (1, 4, 500), (2, 4, 50)])
    assert _starts(jobs, nodes=1, gpus_per_node=4, name="sjf-easy") == [0, 150, 100]


def test_a_preempted_backlog_job_requeues_and_finishes_later():
    # A preemptible job fills the node; a normal job arrives and must not wait for it.
    jobs = [
        TraceJob(0, 0, 1000, 4, 1.0, "batch", preemptible=True, checkpoints=True),
        TraceJob(1, 100, 50, 4, 1.0, "t"),
    ]
    continuous = simulate.Declarations(checkpoint_interval_s=0, restore_s=0)
    outcomes = simulate.replay(jobs, nodes=1, gpus_per_node=4, policy=policy.plan, declarations=continuous)
    assert outcomes[1].start == 100  # the backlog job was preempted at once
    assert outcomes[0].start == 0 and outcomes[0].end == pytest.approx(150 + 900)  # resumed, checkpointed


def test_an_elastic_job_runs_longer_on_fewer_gpus():
    jobs = [TraceJob(0, 0, 100, 2, 1.0, "t"), TraceJob(1, 0, 100, 4, 1.0, "t", min_gpus=2)]
    outcomes = simulate.replay(jobs, nodes=1, gpus_per_node=4, policy=policy.plan)
    assert outcomes[1].start == 0 and outcomes[1].end == pytest.approx(200)


def test_bounded_slowdown_uses_a_ten_second_floor():
    assert simulate.bounded_slowdown(wait=99, run=1) == 10.0
    assert simulate.bounded_slowdown(wait=0, run=1) == 1.0
    assert simulate.bounded_slowdown(wait=100, run=100) == 2.0


def test_jain_index_is_one_for_equal_teams_and_one_over_n_for_a_single_winner():
    assert simulate.jain([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert simulate.jain([5.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)


def test_the_spread_of_bounded_slowdowns_is_their_deviation_over_their_mean():
    # Jain over teams of m random jobs each is about 1 / (1 + cv**2 / m): the figure that says why it moved.
    jobs = [TraceJob(job_id=1, submit_s=0, run_s=100, gpus=4, declared_hours=1, team="a"),
            TraceJob(job_id=2, submit_s=0, run_s=100, gpus=4, declared_hours=1, team="b")]  # fmt: skip
    m = simulate.summarize(
        simulate.replay(jobs, nodes=1, gpus_per_node=4, policy=baselines.fcfs), pool_gpus=4
    )
    assert m["mean_bsld"] == 1.5  # slowdowns 1 and 2 (the second waits 100 s)
    assert m["bsld_cv"] == pytest.approx(0.5 / 1.5, abs=1e-4)
    assert simulate.fight_figures(m)["bsld_cv"] == m["bsld_cv"]


def test_summary_metrics_follow_their_definitions():
    outcomes = simulate.replay(ONE_NODE, nodes=1, gpus_per_node=4, policy=baselines.easy)
    m = simulate.summarize(outcomes, pool_gpus=4)
    waits = [0, 90, 0, 120]
    assert m["mean_wait_s"] == pytest.approx(sum(waits) / 4, abs=0.1)
    assert m["max_wait_s"] == 120
    work = 2 * 100 + 4 * 50 + 1 * 30 + 2 * 200
    makespan = 350  # j3 ends at 150 + 200
    assert m["utilization"] == pytest.approx(work / (4 * makespan), abs=1e-4)
    assert m["makespan_ratio"] == pytest.approx(makespan / max(work / 4, 30 + 200), abs=1e-4)
    assert m["by_size"]["1"]["jobs"] == 1 and m["by_size"]["2-4"]["jobs"] == 3


def test_the_command_line_prints_the_json_summary_last(tmp_path, capsys):
    trace = tmp_path / "tiny.csv"
    trace.write_text(
        "job_id,submission_time,duration,num_gpu\n"
        + "".join(f"j{i},{i * 100},{600 + 60 * i},{1 + i % 8}\n" for i in range(40))
    )
    svg = tmp_path / "out.svg"
    simulate.main(
        ["--trace", str(trace), "--load", "0.9", "--policies", "default,easy", "--json", "--plot", str(svg)]
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    summary = json.loads(last)
    assert summary["jobs"] == 40 and set(summary["policies"]) == {"default", "easy"}
    for m in summary["policies"].values():
        assert set(m["by_size"]) == {"1", "2-4", "5-8", ">8"}
        assert {"mean_bsld", "p99_wait_s", "jain_teams", "utilization", "makespan_ratio"} <= set(m)
    assert svg.read_text().startswith("<svg")


def test_the_replay_uses_decisions_only():
    """Every pass the replay runs is told explain=False, and hands back no sentences or priorities."""
    configs, plans = [], []

    def planned(**kwargs):
        configs.append(kwargs["config"])
        return policy.plan(**kwargs)

    outcomes = simulate.replay(
        ONE_NODE, nodes=1, gpus_per_node=4, policy=planned, on_plan=lambda now, plan: plans.append(plan)
    )
    assert len(configs) == len(plans) >= 3 and not any(config.explain for config in configs)
    assert [(plan.estimates, plan.priority) for plan in plans] == [({}, {})] * len(plans)
    assert sum(len(plan.starts) for plan in plans) == len(outcomes) == len(ONE_NODE)


@st.composite
def mixed_workloads(draw):
    """Jobs on 2-GPU nodes: elastic, wider, preemptible and checkpointing ones, some outrunning
    their estimate (so runs are extended, preempted and requeued)."""
    jobs, t = [], 0.0
    for i in range(draw(st.integers(2, 14))):
        t += draw(st.sampled_from([0.0, 60.0, 600.0]))
        gpus = draw(st.integers(1, 4))
        declared = draw(st.sampled_from([0.25, 0.5, 1.0]))
        run = declared * 3600 * draw(st.sampled_from([0.3, 1.0, 1.5]))
        jobs.append(
            TraceJob(
                i, t, run, gpus, declared, draw(st.sampled_from("ab")),
                min_gpus=draw(st.sampled_from([None, 1])),
                max_gpus=draw(st.sampled_from([None, gpus + 1])),
                preemptible=draw(st.booleans()),
                checkpoints=draw(st.booleans()),
            )
        )  # fmt: skip
    return jobs


@settings(max_examples=40, deadline=None)
@given(mixed_workloads(), st.sampled_from(["default", "easy", "sjf-easy"]))
def test_the_replays_kept_counts_match_its_lists_before_every_pass(jobs, name):
    """What the replay keeps beside its lists, for policies to read instead of scanning: queued
    jobs per size, and each running job's GPUs beside the expected-end order."""
    checked = []

    def checking(**kw):
        pending, running = kw["pending"], kw["running"]
        assert dict(pending.sizes) == dict(Counter(j.gpus for j in pending))
        assert running.held == [sum(map(len, r.gpus_by_node.values())) for r in running]
        assert list(running) == sorted(running, key=lambda r: (r.expected_end, r.job_id))
        checked.append(len(pending))
        return simulate.POLICIES[name](**kw)

    simulate.replay(jobs, nodes=2, gpus_per_node=2, policy=checking)
    assert checked  # every workload has a first pass
