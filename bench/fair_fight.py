"""The scheduler's fair fight in one command: the default policy against EASY-FCFS on the same pools.

    python bench/fair_fight.py                 # ITP clusters at load 0.9, 03 and 06 at 1.05, RICC's first 20,000 jobs
    python bench/fair_fight.py --ricc all      # the whole of RICC May-June instead (minutes)
    python bench/fair_fight.py --rehash 3 --ricc none   # ITP teams from another hashing of the job ids
    python bench/fair_fight.py --set age_weight=1.25 --set starvation_factor=0   # other constants

Every case replays the default policy, EASY-FCFS on the policy's own node-aware engine (the
baseline of the goals) and the textbook flat-pool EASY-FCFS (shown beside it) with
``jobs.scheduling.simulate.replay``, and checks the goals: mean bounded slowdown at least 30 %
below the engine's EASY (20 % at load 1.05), p99 wait of the largest size class at most 1.5 x
EASY's, Jain's index over teams at least EASY's, utilisation within 2 points. Beside Jain, each
policy's spread of bounded slowdowns (standard deviation over mean): over teams drawn at random
Jain's index follows it, about 1 / (1 + cv ** 2 / jobs per team). ITP has no users, so
its teams are CRC-32(job id) mod 8 (``traces.itp_team``); ``--rehash SALT`` draws them from
CRC-32("SALT:row") instead, to see whether a Jain comparison on made-up teams survives another
draw. ``--set NAME=VALUE`` replays the default policy with other constants (``types.PolicyConfig``).
One line per case, then a JSON line with every figure and the misses.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jobs.scheduling import simulate, traces  # noqa: E402
from jobs.scheduling.types import PolicyConfig  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces"
ITP = ("01", "02", "03", "04", "05", "06", "08", "10")
OVERLOADED = ("03", "06")
POLICIES = ("default", "easy-nodes", "easy")


def cases(ricc: str) -> list[tuple[str, Path, float | None, int | None]]:
    """(label, trace, offered load or None for the SWF machine, job limit) per case."""
    out = [(f"ITP {c} @0.9", TRACES / f"itp-2021/cluster{c}.csv", 0.9, None) for c in ITP]
    out += [(f"ITP {c} @1.05", TRACES / f"itp-2021/cluster{c}.csv", 1.05, None) for c in OVERLOADED]
    swf = TRACES / "ricc-2010/RICC-2010-2-may-jun.swf.gz"
    if ricc == "all":
        out.append(("RICC May-June", swf, None, None))
    elif ricc != "none":
        out.append((f"RICC first {int(ricc)}", swf, None, int(ricc)))
    return out


def replay_case(
    path: Path, load: float | None, limit: int | None, rehash: str | None, config: PolicyConfig
) -> dict:
    trace = traces.read_trace(str(path))
    jobs = trace.jobs[:limit] if limit else trace.jobs
    nodes, _ = simulate.choose_pool(trace, jobs, gpus_per_node=8, load=load)
    jobs = [j for j in jobs if j.gpus <= nodes * 8]
    if rehash is not None and trace.machine_gpus is None:  # made-up teams only: SWF has real users
        jobs = [
            dataclasses.replace(j, team=f"team-{zlib.crc32(f'{rehash}:{j.job_id}'.encode()) % 8}")
            for j in jobs
        ]
    figures = {"pool": f"{nodes}x8", "jobs": len(jobs)}
    for name in POLICIES:
        outcomes = simulate.replay(
            jobs,
            nodes=nodes,
            gpus_per_node=8,
            policy=simulate.POLICIES[name],
            config=config if name == "default" else simulate.REPLAY_CONFIG,
        )
        figures[name] = simulate.fight_figures(simulate.summarize(outcomes, pool_gpus=nodes * 8))
    return figures


def goals(figures: dict, *, overloaded: bool) -> dict[str, bool]:
    ours, easy = figures["default"], figures["easy-nodes"]
    p99_easy = easy["p99_wait_largest_s"]
    return {
        "bsld": ours["mean_bsld"] <= (0.8 if overloaded else 0.7) * easy["mean_bsld"],
        "p99": ours["p99_wait_largest_s"] <= 1.5 * p99_easy if p99_easy else not ours["p99_wait_largest_s"],
        "jain": ours["jain_teams"] >= easy["jain_teams"],
        "utilisation": abs(ours["utilization"] - easy["utilization"]) <= 0.02 + 1e-9,  # 2 points, float-safe
    }


def line(label: str, figures: dict, held: dict[str, bool]) -> str:
    ours, easy, flat = figures["default"], figures["easy-nodes"], figures["easy"]
    if easy["p99_wait_largest_s"]:
        p99 = f"{ours['p99_wait_largest_s'] / easy['p99_wait_largest_s']:4.2f}x"
    else:  # EASY never kept its largest jobs waiting: any wait of ours is a miss, not a ratio
        p99 = f"{ours['p99_wait_largest_s']:.0f} s vs 0"
    missed = [goal for goal, ok in held.items() if not ok]
    return (
        f"{label:18} {figures['pool']:>7}  bsld {ours['mean_bsld']:8.2f} vs EASY {easy['mean_bsld']:8.2f} "
        f"(textbook {flat['mean_bsld']:8.2f}) {100 * (ours['mean_bsld'] / easy['mean_bsld'] - 1):+6.1f} %  "
        f"p99 {p99}  Jain {ours['jain_teams']:.4f} vs {easy['jain_teams']:.4f} "
        f"(slowdowns' cv {ours['bsld_cv']:.2f} vs {easy['bsld_cv']:.2f})  "
        f"util {100 * (ours['utilization'] - easy['utilization']):+4.1f} pt  "
        + ("held" if not missed else "MISSED " + ", ".join(missed))
    )


def with_constants(settings: list[str]) -> PolicyConfig:
    """The replay's configuration with ``NAME=VALUE`` constants changed (ints stay ints)."""
    changes: dict[str, object] = {}
    for setting in settings:
        name, _, value = setting.partition("=")
        if name not in {f.name for f in dataclasses.fields(PolicyConfig)}:
            raise SystemExit(f"--set {name}: no such constant of the policy (see types.PolicyConfig)")
        kind = type(getattr(simulate.REPLAY_CONFIG, name))
        if kind is bool:
            if value.lower() not in ("true", "false"):
                raise SystemExit(f"--set {name}: true or false, not {value!r}")
            changes[name] = value.lower() == "true"
        elif kind is int:
            if not float(value).is_integer():
                raise SystemExit(f"--set {name}: a whole number, not {value!r}")
            changes[name] = int(float(value))
        else:
            changes[name] = kind(value)
    return dataclasses.replace(simulate.REPLAY_CONFIG, **changes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ricc", default="20000", help="RICC's first N jobs, 'all' or 'none' (default 20000)")
    ap.add_argument("--rehash", help="draw ITP teams from CRC-32('SALT:row') instead of the job ids")
    ap.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="a constant of the default policy"
    )
    args = ap.parse_args()
    config = with_constants(args.set)
    out: dict = {"rehash": args.rehash, "constants": args.set, "cases": {}, "misses": []}
    for label, path, load, limit in cases(args.ricc):
        figures = replay_case(path, load, limit, args.rehash, config)
        held = goals(figures, overloaded=load is not None and load > 1)
        print(line(label, figures, held), flush=True)
        out["cases"][label] = {**figures, "held": held}
        out["misses"] += [f"{label}: {goal}" for goal, ok in held.items() if not ok]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
