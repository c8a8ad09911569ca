"""What each declaration buys, measured by replay: checkpoints, preemptible and elastic shares, estimates."""

import json

import pytest

from jobs.scheduling import declarations, policy, simulate
from jobs.scheduling.simulate import Declarations
from jobs.scheduling.traces import TraceJob


# One node of 4 GPUs: a backlog job fills it, a normal job arrives at 4000 s and preempts it at once.
def _preempted(*, checkpoints):
    backlog = TraceJob(0, 0, 7200, 4, 3.0, "batch", preemptible=True, checkpoints=checkpoints)
    return [backlog, TraceJob(1, 4000, 100, 4, 1.0, "t")]


def test_a_checkpointing_job_loses_only_the_work_since_its_last_checkpoint():
    outcomes = simulate.replay(
        _preempted(checkpoints=True), nodes=1, gpus_per_node=4, policy=policy.plan,
        declarations=Declarations(checkpoint_interval_s=1800, restore_s=120),
    )  # fmt: skip
    assert outcomes[1].start == 4000
    # 4000 s run, checkpoints at 1800 and 3600: 400 s lost; resumed at 4100 with 3600 s + 120 s to restore
    assert outcomes[0].end == pytest.approx(4100 + 3600 + 120)
    assert outcomes[0].lost_gpu_seconds == pytest.approx((400 + 120) * 4)


def test_a_preemptible_job_without_checkpoints_starts_over():
    outcomes = simulate.replay(_preempted(checkpoints=False), nodes=1, gpus_per_node=4, policy=policy.plan)
    assert outcomes[0].end == pytest.approx(4100 + 7200)
    assert outcomes[0].lost_gpu_seconds == pytest.approx(4000 * 4)
    assert simulate.summarize(outcomes, pool_gpus=4)["lost_gpu_hours"] == pytest.approx(
        4000 * 4 / 3600, abs=0.01
    )


def _many(n=2000):
    return [TraceJob(i, i * 10.0, 600, 1 + i % 8, 1.0, "t") for i in range(n)]


def test_shares_pick_a_stable_share_of_the_jobs():
    d = Declarations(checkpoint_share=0.5, preemptible_share=0.2, elastic_share=0.5)
    declared = simulate.declare(_many(), d)
    assert declared == simulate.declare(_many(), d)  # the same jobs on every run
    checkpointing = [j for j in declared if j.checkpoints]
    assert 900 < len(checkpointing) < 1100 and all(j.preemptible for j in checkpointing)
    assert 100 < sum(j.preemptible and not j.checkpoints for j in declared) < 300  # 20 % of the other half
    elastic = [j for j in declared if j.min_gpus is not None]
    assert elastic and all(j.gpus > 1 and j.min_gpus == (j.gpus + 1) // 2 for j in elastic)
    assert simulate.declare(_many(), Declarations()) == _many()


def test_the_table_compares_each_declaration_with_todays():
    jobs = [TraceJob(i, i * 60.0, 600 + 60 * (i % 5), 1 + (i % 4) * 2, 4.0, f"t{i % 3}") for i in range(60)]
    table = declarations.compare(jobs, nodes=2, gpus_per_node=8, scenarios=declarations.SCENARIOS)
    today, *rest = table
    assert today["scenario"] == "today's declarations" and today["vs_today"]["mean_bsld"] == "±0 %"
    assert len(rest) == len(declarations.SCENARIOS) - 1
    exact = next(r for r in rest if r["scenario"].startswith("exact run times"))
    assert exact["mean_bsld"] < today["mean_bsld"]  # declared 4 h for 10-minute jobs: exact backfills more
    for row in table:
        assert set(row) >= {"mean_bsld", "p99_wait_largest_s", "utilization", "lost_gpu_hours", "vs_today"}


def test_the_command_prints_the_table_and_the_json_last(tmp_path, capsys):
    trace = tmp_path / "tiny.csv"
    trace.write_text(
        "job_id,submission_time,duration,num_gpu\n"
        + "\n".join(f"j{i},{i * 60},{600 + 60 * (i % 5)},{1 + (i % 4) * 2}" for i in range(40))
        + "\n"
    )
    declarations.main(["--trace", str(trace), "--load", "0.9"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("| today's declarations |") for line in lines)
    summary = json.loads(lines[-1])
    assert summary["traces"][0]["trace"] == "tiny.csv" and summary["assumptions"]


def test_a_replay_makes_the_declarations_it_is_given():
    jobs = _many(50)
    outcomes = simulate.replay(
        jobs, nodes=4, gpus_per_node=8, policy=policy.plan,
        declarations=Declarations(checkpoint_share=1.0, elastic_share=1.0),
    )  # fmt: skip
    assert all(o.job.checkpoints and o.job.preemptible for o in outcomes)
    assert all(o.job.min_gpus == (o.job.gpus + 1) // 2 for o in outcomes if o.job.gpus > 1)


def test_a_wide_share_may_start_twice_as_wide():
    declared = simulate.declare(_many(), Declarations(wide_share=0.5))
    wide = [j for j in declared if j.max_gpus is not None]
    assert 900 < len(wide) < 1100 and all(j.max_gpus == 2 * j.gpus for j in wide)
    assert any(name.startswith("half the jobs may start twice as wide") for name, _ in declarations.SCENARIOS)
