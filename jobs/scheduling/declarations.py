"""What a job's declarations buy the scheduler, measured: one trace replayed under each, against today's.

    python -m jobs.scheduling.declarations --trace FILE [--trace FILE ...] [--load L] [--limit N]
        [--gpus-per-node G] [--policy default]

Each scenario changes one declaration (the last all at once) and replays the same jobs on the same
pool with the same policy (``jobs.scheduling.simulate.replay``): run times as declared, learned per
team or exact; a share of jobs that checkpoint; a share preemptible without checkpoints; a share of
elastic ranges (narrower starts); a share that may start twice as wide. Each row gives mean bounded slowdown, the p99 wait of the largest size class
present, utilisation and GPU-hours lost to preemption, each against the baseline of today's
declarations, and how many reserved jobs started after their first reserved start (by how much, on
average). Predictions that fell short delay reservations; declared limits never delay an EASY
reservation, but the default policy hands its one reservation to whichever job leads the queue, so a
few reserved jobs start late under today's declarations too: compare each row with the baseline's) (declared run times, nothing checkpointing, preemptible or elastic). A Markdown table
per trace, then the JSON summary on the last line (what ``record_simulation --declarations``
stores). Pure standard library.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from jobs.scheduling import traces
from jobs.scheduling.simulate import (
    POLICIES,
    Declarations,
    largest_class,
    replay,
    size_pool,
    summarize,
)
from jobs.scheduling.traces import TraceJob

SCENARIOS: tuple[tuple[str, Declarations], ...] = (
    ("today's declarations", Declarations()),
    ("learned run times", Declarations(estimates="learned")),
    ("exact run times (bound)", Declarations(estimates="exact")),
    ("half the jobs checkpoint", Declarations(checkpoint_share=0.5)),
    ("half the jobs preemptible, no checkpoints", Declarations(preemptible_share=0.5)),
    ("half the multi-GPU jobs elastic", Declarations(elastic_share=0.5)),
    ("half the jobs may start twice as wide", Declarations(wide_share=0.5)),
    (
        "all: learned, half checkpoint, half elastic",
        Declarations(estimates="learned", checkpoint_share=0.5, elastic_share=0.5),
    ),
)
ASSUMPTIONS = (
    "Baseline: today's declarations - the trace's run-time estimates (SWF: the user's requested time; "
    "ITP: the duration rounded up to a whole hour), no job checkpointing, preemptible or elastic.",
    "Learned run times: per team, the recency-weighted median of actual / declared over its last 50 jobs "
    "finished earlier in the replay (at least 5), never past the declared limit; a job that outruns its "
    "prediction has it doubled at once. Exact: the true run time, an oracle no scheduler has.",
    "Which jobs: each share is a stable pick by a hash (BLAKE2b) of the job id, the same jobs in every scenario. "
    "Checkpointing jobs are preemptible (backlog: they run on idle GPUs and yield to reservations).",
    "What a checkpoint costs: a checkpoint every 30 minutes, free to write; a preempted job loses the "
    "work since its last one and takes 2 minutes to restore. Preemptible jobs without checkpoints "
    "start over.",
    "How a narrower start slows a job: an elastic job (half to all of its declared GPUs) started on "
    "fewer GPUs runs proportionally longer (work conserved).",
    "How a wider start speeds a job: a job that may start twice as wide (max_gpus) does so only on GPUs "
    "nothing else waits for, on the nodes it was placed on, and runs proportionally shorter - linear "
    "speed-up, the best case; real jobs gain less.",
    "GPU-hours lost: GPU time of work thrown away by preemptions plus restoring from checkpoints.",
)


def _change(value: float, base: float) -> str:
    if abs(value - base) < 1e-9:
        return "±0 %"
    if not base:
        return "new"
    return f"{100.0 * (value / base - 1.0):+.1f} %"


def compare(
    jobs: Sequence[TraceJob],
    *,
    nodes: int,
    gpus_per_node: int,
    scenarios: Sequence[tuple[str, Declarations]] = SCENARIOS,
    policy: str = "default",
) -> list[dict]:
    """One row per scenario, the first the baseline every other is compared with."""
    rows: list[dict] = []
    for name, declarations in scenarios:
        began = time.perf_counter()
        outcomes = replay(
            jobs, nodes=nodes, gpus_per_node=gpus_per_node, policy=POLICIES[policy], declarations=declarations
        )
        m = summarize(outcomes, pool_gpus=nodes * gpus_per_node)
        big = largest_class(m)
        row = {
            "scenario": name,
            "mean_bsld": m["mean_bsld"],
            "p99_wait_largest_s": m["by_size"][big]["p99_wait_s"],
            "largest_class": big,
            "utilization": m["utilization"],
            "lost_gpu_hours": m["lost_gpu_hours"],
            "late_reservations": m["reservations"]["late"],
            "late_by_mean_s": m["reservations"]["mean_delay_s"],
            "replay_s": round(time.perf_counter() - began, 1),
        }
        base = rows[0] if rows else row
        row["vs_today"] = {
            "mean_bsld": _change(row["mean_bsld"], base["mean_bsld"]),
            "p99_wait_largest_s": _change(row["p99_wait_largest_s"], base["p99_wait_largest_s"]),
            "utilization": f"{100.0 * (row['utilization'] - base['utilization']):+.1f} points",
            "lost_gpu_hours": f"{row['lost_gpu_hours'] - base['lost_gpu_hours']:+.1f}",
        }
        rows.append(row)
    return rows


def markdown(trace: dict) -> str:
    """One trace's rows as a Markdown table (values, with the change against today's in brackets)."""
    head = (
        f"{trace['trace']}: {trace['jobs']} jobs, {trace['pool']}, policy {trace['policy']}\n\n"
        "| declarations | mean bounded slowdown | p99 wait, largest class | utilisation | "
        "GPU-hours lost to preemption | reservations started late (mean delay) |\n| --- | --- | --- | --- | --- | --- |"
    )
    lines = [head]
    for r in trace["rows"]:
        v = r["vs_today"]
        lines.append(
            f"| {r['scenario']} | {r['mean_bsld']:.2f} ({v['mean_bsld']}) | "
            f"{r['p99_wait_largest_s'] / 3600:.1f} h, {r['largest_class']} GPUs ({v['p99_wait_largest_s']}) | "
            f"{r['utilization']:.3f} ({v['utilization']}) | {r['lost_gpu_hours']:.1f} ({v['lost_gpu_hours']}) | "
            f"{r['late_reservations']} ({r['late_by_mean_s'] / 3600:.1f} h) |"
        )
    return "\n".join(lines)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m jobs.scheduling.declarations", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--trace", action="append", required=True, help="SWF or ITP CSV; repeat for several")
    ap.add_argument("--load", type=float, default=0.9, help="size each pool for this offered load")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--limit", type=int, help="replay only each trace's first N jobs")
    ap.add_argument("--policy", default="default", choices=sorted(POLICIES))
    return ap.parse_args(argv)


def run_trace(path: str, *, load: float, gpus_per_node: int, limit: int | None, policy: str) -> dict:
    trace = traces.read_trace(path)
    jobs = trace.jobs[:limit] if limit else trace.jobs
    nodes, pool_note = size_pool(jobs, load=load, gpus_per_node=gpus_per_node)
    kept = [j for j in jobs if j.gpus <= nodes * gpus_per_node]
    rows = compare(kept, nodes=nodes, gpus_per_node=gpus_per_node, policy=policy)
    sliced = f"its first {len(jobs)} jobs" if limit and limit < len(trace.jobs) else "all its jobs"
    return {
        "trace": trace.name, "jobs": len(kept), "sliced": sliced, "pool": pool_note.split(": ", 1)[1],
        "policy": policy, "notes": trace.notes, "rows": rows,
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> dict:
    args = _parse_args(argv)
    summary: dict = {"traces": [], "assumptions": list(ASSUMPTIONS)}
    for path in args.trace:
        result = run_trace(
            path, load=args.load, gpus_per_node=args.gpus_per_node, limit=args.limit, policy=args.policy
        )
        summary["traces"].append(result)
        print(markdown(result) + "\n", flush=True)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
