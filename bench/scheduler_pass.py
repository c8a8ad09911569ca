"""How long one scheduler pass takes on a big, busy pool: 1,000 nodes x 8 GPUs, 10,000 queued jobs.

    .venv/bin/python bench/scheduler_pass.py [--passes 20] [--seed 7] [--room]

The running set is mixed (1-64 GPUs, some backlog jobs) and fills about 90% of the GPUs; the
queue mixes sizes, teams, declared hours, elastic and staging jobs. Each pass is a full
``plan()`` with estimates and reasons, as the live scheduler runs it; between passes the clock
moves a few seconds. ``--room``: nodes also advertise memory, CPUs and their disk's free bytes, and
jobs need their share of each and an attempt space, as live agents and the snapshot give them (a
tenth of the nodes' disks nearly full). Prints a JSON line last: {"pending", "nodes", "room",
"p50_ms", "p95_ms"}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobs.scheduling import policy, types

NODES, GPUS, PENDING, TEAMS = 1000, 8, 10_000, 40
NOW = 1_780_000_000.0
MEMORY, CPUS, SPACE = 2 * 10**12, 128.0, 10.5 * 10**9  # a node's offer; an attempt space of the default size
SIZES = [1] * 50 + [2] * 12 + [4] * 12 + [8] * 16 + [16] * 6 + [32] * 3 + [64] * 1


def build_running(rng: random.Random) -> tuple[list[types.NodeView], list[types.RunningView]]:
    """Fill the pool to about 90%: multi-node jobs take whole nodes, the rest pack best-fit."""
    free = {f"gpu-{i:04d}": list(range(GPUS)) for i in range(NODES)}
    names = list(free)
    running, target, busy, job_id = [], int(0.9 * NODES * GPUS), 0, 1_000_000
    while busy < target:
        g = rng.choice(SIZES)
        held = _place(free, names, g, rng)
        if held is None:
            continue
        started = NOW - rng.uniform(0, 20) * 3600
        running.append(
            types.RunningView(
                job_id=job_id,
                team=f"team-{rng.randrange(TEAMS):02d}",
                gpus_by_node=held,
                started_at=started,
                expected_end=started + rng.choice([1, 2, 4, 8, 24, 48]) * 3600,
                preemptible=rng.random() < 0.05,
            )
        )
        busy, job_id = busy + g, job_id + 1
    nodes = [types.NodeView(name=n, gpus=GPUS, free=tuple(free[n])) for n in names]
    return nodes, running


def with_room(nodes: list[types.NodeView], rng: random.Random) -> list[types.NodeView]:
    """The nodes as live agents report them: 2 TB and 128 CPUs offered, the busy GPUs' shares held, and a disk
    with room for 2 to 40 attempt spaces (a tenth nearly full)."""
    out = []
    for n in nodes:
        idle = len(n.free) / n.gpus
        disk = SPACE * (rng.uniform(0, 1.5) if rng.random() < 0.1 else rng.uniform(2, 40))
        out.append(
            dataclasses.replace(
                n, memory=MEMORY, cpus=CPUS, free_memory=MEMORY * idle, free_cpus=CPUS * idle, free_disk=disk
            )
        )
    return out


def _place(free: dict, names: list[str], g: int, rng: random.Random) -> dict | None:
    if g > GPUS:
        whole = [n for n in names if len(free[n]) == GPUS][: g // GPUS]
        if len(whole) < g // GPUS:
            return None
        for n in whole:
            free[n] = []
        return {n: tuple(range(GPUS)) for n in whole}
    for n in rng.sample(names, 40):
        if len(free[n]) >= g:
            taken, free[n] = free[n][:g], free[n][g:]
            return {n: tuple(taken)}
    return None


def build_pending(rng: random.Random) -> list[types.PendingJob]:
    jobs = []
    for i in range(PENDING):
        g = rng.choice(SIZES)
        jobs.append(
            types.PendingJob(
                job_id=i,
                team=f"team-{rng.randrange(TEAMS):02d}",
                gpus=g,
                hours=rng.choice([0.5, 1, 2, 4, 8, 24, 72]),
                submitted_at=NOW - rng.uniform(0, 3 * 86400),
                min_gpus=max(1, g // 2) if rng.random() < 0.1 else None,
                preemptible=rng.random() < 0.05,
                ready_at=NOW + 1800 if rng.random() < 0.05 else None,
            )
        )
    return jobs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--room", action="store_true", help="place by memory, CPUs and disk too")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    nodes, running = build_running(rng)
    pending = build_pending(rng)
    if args.room:
        nodes = with_room(nodes, rng)
        pending = [dataclasses.replace(j, space=SPACE) for j in pending]
    usage = {f"team-{t:02d}": rng.uniform(0, 5e6) for t in range(TEAMS)}
    times = []
    for k in range(args.passes):
        began = time.perf_counter()
        result = policy.plan(
            now=NOW + 5 * k, nodes=nodes, running=running, pending=pending, usage=usage, shares={}
        )
        times.append((time.perf_counter() - began) * 1000)
        assert len(result.estimates) == len(pending)
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * len(times)) - 1)]
    print(
        f"{len(result.starts)} starts, {len(result.reservations)} reservations, "
        f"{len(result.preemptions)} preemptions in the last pass; busy {sum(n.gpus - len(n.free) for n in nodes)} GPUs"
    )
    print(
        json.dumps(
            {
                "pending": len(pending),
                "nodes": len(nodes),
                "room": args.room,
                "p50_ms": round(statistics.median(times), 1),
                "p95_ms": round(p95, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
