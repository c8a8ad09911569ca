"""Replay schedules recorded once, checked after every change to the simulator: bit-identical starts.

    python bench/replay_equivalence.py --record [--cases A,B]  # writes bench/replay_schedules.json
    python bench/replay_equivalence.py [--cases A,B]           # replays them; exit 1 on any difference

Record again only when a policy is meant to decide differently (say why in the commit).

Each case is a slice of a trace in ../shared/traces (read from there, never copied) on a fixed
pool, with optional declarations (backlog, elastic, wide jobs; learned estimates) so that every
path of the replay is covered. For every policy the file keeps a SHA-256 of the schedule (per job:
first start, end, GPU-seconds, in ``repr`` so floats compare bit for bit) and its first starts; a
check replays the case and names the first job whose schedule differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jobs.scheduling import simulate, traces  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces"
RECORD = Path(__file__).with_name("replay_schedules.json")
CASES = {
    "itp-cluster01-load0.9-3000": dict(trace="itp-2021/cluster01.csv", limit=3000, load=0.9),
    "ricc-first-3000": dict(trace="ricc-2010/RICC-2010-2-may-jun.swf.gz", limit=3000, nodes=1024),
    "ricc-first-3000-small-pool": dict(trace="ricc-2010/RICC-2010-2-may-jun.swf.gz", limit=3000, nodes=256),
    "itp-cluster04-load1.05-2000-declared": dict(
        trace="itp-2021/cluster04.csv",
        limit=2000,
        load=1.05,
        declarations=dict(
            estimates="learned",
            checkpoint_share=0.2,
            preemptible_share=0.1,
            elastic_share=0.2,
            wide_share=0.1,
        ),
    ),
}
POLICIES = tuple(simulate.POLICIES)


def _jobs_and_pool(case: dict) -> tuple[list[traces.TraceJob], int]:
    trace = traces.read_trace(str(TRACES / case["trace"]))
    jobs = trace.jobs[: case["limit"]]
    if "load" in case:
        nodes, _ = simulate.size_pool(jobs, load=case["load"], gpus_per_node=8)
    else:
        nodes = case["nodes"]
    return [j for j in jobs if j.gpus <= nodes * 8], nodes


def schedules(case: dict) -> dict[str, dict]:
    jobs, nodes = _jobs_and_pool(case)
    declarations = simulate.Declarations(**case.get("declarations", {}))
    out = {}
    for name in POLICIES:
        began = time.perf_counter()
        outcomes = simulate.replay(
            jobs, nodes=nodes, gpus_per_node=8, policy=simulate.POLICIES[name], declarations=declarations
        )
        rows = [(repr(o.start), repr(o.end), repr(o.gpu_seconds)) for o in outcomes]
        out[name] = {
            "sha256": hashlib.sha256(json.dumps(rows).encode()).hexdigest(),
            "starts": [r[0] for r in rows],
            "seconds": round(time.perf_counter() - began, 2),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", action="store_true", help="write the schedules instead of checking them")
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    args = ap.parse_args()
    names = args.cases.split(",") if args.cases else list(CASES)
    recorded = json.loads(RECORD.read_text()) if RECORD.exists() else {}  # --record --cases: keep the rest
    failed = 0
    for name in names:
        got = schedules(CASES[name])
        for policy, sched in got.items():
            if args.record:
                print(f"{name} {policy}: recorded {sched['sha256'][:12]} ({sched['seconds']} s)")
                continue
            want = recorded[name][policy]
            if want["sha256"] == sched["sha256"]:
                print(f"{name} {policy}: identical ({sched['seconds']} s)")
                continue
            failed += 1
            first = next(
                (i for i, (a, b) in enumerate(zip(want["starts"], sched["starts"], strict=True)) if a != b),
                None,
            )
            print(f"{name} {policy}: DIFFERS (first differing start: job {first})")
        if args.record:
            recorded[name] = {p: {k: v for k, v in s.items() if k != "seconds"} for p, s in got.items()}
    if args.record:
        RECORD.write_text(json.dumps(recorded, separators=(",", ":")) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
