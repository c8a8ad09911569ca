"""Replay speed and the fair-fight figures: seconds per policy beside a trivial FCFS loop (the floor).

    python bench/replay.py --trace ../shared/traces/ricc-2010/RICC-2010-2-may-jun.swf.gz
    python bench/replay.py --trace ../shared/traces/itp-2021/cluster04.csv --load 0.9 [--limit N]

Every policy replays the same jobs on the same pool (``jobs.scheduling.simulate.replay``); the
floor is a plain FCFS loop over those jobs on a flat pool with no policy call at all, timed in the
same run, so the ratio says what the policy machinery costs. Teams and estimates are derived once
by the trace reader, the same way for every policy (its notes are printed). The last line is JSON:
per policy mean bounded slowdown, p99 wait of the largest size class present, Jain's index over
teams, utilisation and replay seconds; the machine's load average is recorded beside them.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobs.scheduling import simulate, traces


def fcfs_floor(jobs: list[traces.TraceJob], pool_gpus: int) -> float:
    """Seconds for the simplest replay of ``jobs``: strict FCFS on a flat pool, a heap of ends."""
    began = time.perf_counter()
    free, ends, clock = pool_gpus, [], 0.0
    for job in jobs:
        clock = max(clock, job.submit_s)
        while free < job.gpus:
            end, gpus = heapq.heappop(ends)
            clock, free = max(clock, end), free + gpus
        free -= job.gpus
        heapq.heappush(ends, (clock + job.run_s, job.gpus))
    return time.perf_counter() - began


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--load", type=float, help="size the pool for this offered load (else the SWF machine)")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--policies", default="default,easy-nodes,easy,sjf-easy,fcfs")
    args = ap.parse_args()
    trace = traces.read_trace(args.trace)
    jobs = trace.jobs[: args.limit] if args.limit else trace.jobs
    for note in trace.notes:
        print(note)
    nodes, note = simulate.choose_pool(trace, jobs, gpus_per_node=args.gpus_per_node, load=args.load)
    print(note)
    pool_gpus = nodes * args.gpus_per_node
    jobs = [j for j in jobs if j.gpus <= pool_gpus]
    out = {
        "trace": trace.name,
        "jobs": len(jobs),
        "pool": f"{nodes}x{args.gpus_per_node}",
        "load": args.load,
        "floor_s": round(fcfs_floor(jobs, pool_gpus), 2),
        "policies": {},
    }
    for name in args.policies.split(","):
        began = time.perf_counter()
        outcomes = simulate.replay(
            jobs, nodes=nodes, gpus_per_node=args.gpus_per_node, policy=simulate.POLICIES[name]
        )
        wall = time.perf_counter() - began
        figures = simulate.fight_figures(simulate.summarize(outcomes, pool_gpus=pool_gpus))
        out["policies"][name] = {**figures, "replay_s": round(wall, 1)}
        print(name, json.dumps(out["policies"][name]), flush=True)
    out["loadavg_1m"] = round(os.getloadavg()[0], 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
