"""The replay's schedules do not change when the simulator is made faster.

Synthetic workloads (a seeded generator: wide and narrow jobs, overestimates, several teams, and
with declarations: backlog, checkpointing, elastic and wide jobs, learned estimates) replayed with
every policy; each schedule's SHA-256 (per job: first start, end, GPU-seconds, floats bit for bit)
was recorded from the simulator before its incremental structures, and must stay the same.
``bench/replay_equivalence.py`` checks slices of the real traces the same way.
"""

import hashlib
import json
import random

import pytest

from jobs.scheduling import simulate
from jobs.scheduling.traces import TraceJob


def _workload(seed: int, n: int, *, max_gpus: int) -> list[TraceJob]:
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(n):
        t += rng.choice([0.0, 0.0, 30.0, 120.0, 600.0, 1800.0])
        declared = rng.choice([0.25, 0.5, 1.0, 2.0, 6.0, 24.0])
        run = max(1.0, declared * 3600.0 * rng.choice([0.05, 0.3, 0.7, 1.0, 1.3]))
        gpus = rng.choice([1, 1, 1, 2, 4, 8, 8, 16, 24, max_gpus])
        jobs.append(TraceJob(i, t, float(int(run)), gpus, declared, rng.choice("abcd")))
    return jobs


def _digest(outcomes) -> str:
    rows = [(repr(o.start), repr(o.end), repr(o.gpu_seconds)) for o in outcomes]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


BUSY = simulate.Declarations(
    estimates="learned", checkpoint_share=0.2, preemptible_share=0.1, elastic_share=0.2, wide_share=0.1
)
RECORDED = {
    ("plain", "default"): "76a26242257228d6",
    ("plain", "easy-nodes"): "ec5f8aecbd84a0f9",
    ("plain", "easy"): "ff5830a74f3ed3af",
    ("plain", "sjf-easy"): "f683e243c6b4a804",
    ("plain", "fcfs"): "746d5dd74f42d155",
    # learned estimates: the policy ranks by the declared hours, plans backfill with the learned ones
    ("declared", "default"): "6b4dcf57f049b513",
    ("declared", "easy-nodes"): "c600923cb07770ef",
    ("declared", "easy"): "4997ebd5c0356c54",
    ("declared", "sjf-easy"): "c261017aabdff7d7",
    ("declared", "fcfs"): "746d5dd74f42d155",
}


@pytest.mark.parametrize(("case", "name"), sorted(RECORDED))
def test_the_replay_keeps_its_recorded_schedules(case, name):
    jobs = _workload(16, 700, max_gpus=48)
    declarations = BUSY if case == "declared" else simulate.TODAY
    outcomes = simulate.replay(
        jobs, nodes=8, gpus_per_node=8, policy=simulate.POLICIES[name], declarations=declarations
    )
    assert _digest(outcomes) == RECORDED[(case, name)]
