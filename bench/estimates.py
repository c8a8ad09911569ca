"""How true the first estimated start a waiting job is told turns out, on real traces.

    python bench/estimates.py                  # ITP clusters 01, 03, 05, 06 at load 0.9
    python bench/estimates.py --clusters 02 --load 1.05

Replays each trace with the default policy, its estimates on (``explain=True``, as the live scheduler
runs it), and keeps the first estimate every job is told that does not start in the pass that tells it.
The replay runs the policy only while some GPU is idle or a backlog job runs, so a job submitted into a
full pool is told at the next pass. ITP declares each job's true run time, so what is measured is the
estimate's own reasoning: work queued ahead, reservations, GPUs idle on the nodes that can hold the job,
and the jobs that arrive after it and overtake it (which no estimate can know). Per case: how many were
told a time, how far their real start fell from it (median and p90 of |real - told|, the median of real - told,
negative where jobs start sooner than told, and how often the job started more than an hour later than told), and how many were told "about now" (within five minutes)
yet waited more than an hour. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jobs.scheduling import simulate, traces  # noqa: E402
from jobs.scheduling.types import PolicyConfig  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces" / "itp-2021"
NOW_S = 300.0  # "about now": within five minutes of the telling
LATE_S = 3600.0


def first_estimates(jobs, *, nodes: int) -> tuple[dict[int, tuple[float, float]], list[simulate.Outcome]]:
    """Per job (its index in ``jobs``, as the replay numbers it): (when first told, start told), of jobs not
    started by the pass that told them."""
    told: dict[int, tuple[float, float]] = {}

    def note(now: float, plan) -> None:
        started = {s.job_id for s in plan.starts}
        for jid, estimate in plan.estimates.items():
            if jid not in told and jid not in started and estimate.start_at is not None:
                told[jid] = (now, estimate.start_at)

    outcomes = simulate.replay(
        jobs, nodes=nodes, gpus_per_node=8, policy=simulate.POLICIES["default"],
        config=PolicyConfig(explain=True), on_plan=note,
    )  # fmt: skip
    return told, outcomes


def figures(told: dict[int, tuple[float, float]], outcomes: list[simulate.Outcome]) -> dict:
    errors, signed, late, wrongly_now = [], [], 0, 0
    for index, o in enumerate(outcomes):  # in job order
        if index not in told or math.isnan(o.start):
            continue
        at, start_told = told[index]
        errors.append(abs(o.start - start_told))
        signed.append(o.start - start_told)
        late += o.start - start_told > LATE_S
        wrongly_now += start_told - at <= NOW_S and o.start - at > LATE_S
    errors.sort()
    signed.sort()
    return {
        "told": len(errors),
        "median_error_min": round(simulate.percentile(errors, 50) / 60, 1) if errors else None,
        "p90_error_min": round(simulate.percentile(errors, 90) / 60, 1) if errors else None,
        "median_real_minus_told_min": round(simulate.percentile(signed, 50) / 60, 1) if signed else None,
        "later_than_told_by_1h": late,
        "told_now_waited_1h": wrongly_now,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clusters", nargs="+", default=["01", "03", "05", "06"])
    parser.add_argument("--load", type=float, default=0.9)
    args = parser.parse_args(argv)
    out = {}
    for c in args.clusters:
        trace = traces.read_trace(str(TRACES / f"cluster{c}.csv"))
        nodes, _ = simulate.choose_pool(trace, trace.jobs, gpus_per_node=8, load=args.load)
        jobs = [j for j in trace.jobs if j.gpus <= nodes * 8]
        told, outcomes = first_estimates(jobs, nodes=nodes)
        out[f"ITP {c} @{args.load:g}"] = f = figures(told, outcomes)
        print(
            f"ITP {c} @{args.load:g} {nodes}x8: {f['told']} told a time; |real - told| median "
            f"{f['median_error_min']} min, p90 {f['p90_error_min']} min (median real - told "
            f"{f['median_real_minus_told_min']} min); {f['later_than_told_by_1h']} started over "
            f"an hour later than told; {f['told_now_waited_1h']} told 'about now' waited over an hour",
            flush=True,
        )
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
