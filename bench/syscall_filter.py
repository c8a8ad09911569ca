"""What the job syscall filter costs: a job's start and a million system calls inside it, with the filter and with
an allow-all filter (the same mechanism refusing nothing), alternating, medians. Root and bubblewrap, no database.

    python bench/syscall_filter.py [--rounds 12]

Last line: {"start_ms": {"filter", "allow_all"}, "million_calls_ms": {"filter", "allow_all"}, "ratio": {...}}.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "e31web.settings")

import django  # noqa: E402

django.setup()

from jobs import syscalls  # noqa: E402
from tests.jobs.sandboxed import allow_all, run_job  # noqa: E402

JOB_UID = 398990
# getppid: the cheapest real system call, so the filter's own cost is as large a part of it as it can be.
CALLS = "import os, time\nt = time.perf_counter()\nfor _ in range(1_000_000): os.getppid()\nprint(time.perf_counter() - t)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    rounds = parser.parse_args().rounds
    programs = {"filter": syscalls.compiled(), "allow_all": allow_all()}
    start = {name: [] for name in programs}
    calls = {name: [] for name in programs}
    for _ in range(rounds):
        for name, program in programs.items():
            syscalls.compiled = lambda program=program: program
            began = time.perf_counter()
            run_job(JOB_UID, ["/usr/bin/true"])
            start[name].append((time.perf_counter() - began) * 1e3)
            calls[name].append(float(run_job(JOB_UID, ["/usr/bin/python3", "-c", CALLS])) * 1e3)
    medians = {
        "start_ms": {name: round(statistics.median(v), 2) for name, v in start.items()},
        "million_calls_ms": {name: round(statistics.median(v), 1) for name, v in calls.items()},
    }
    medians["ratio"] = {k: round(v["filter"] / v["allow_all"], 3) for k, v in medians.items()}
    medians["rules"] = len(programs["filter"]) // 8  # BPF instructions
    print(json.dumps(medians))


if __name__ == "__main__":
    main()
