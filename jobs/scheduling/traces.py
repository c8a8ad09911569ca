"""Readers for real workload traces: Standard Workload Format (SWF) and the Microsoft ITP CSVs.

Both give ``TraceJob`` rows sorted by submit time (then trace order), plus the assumptions the
reader had to make, as sentences the simulator prints. Pure standard library.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace: the policy sees ``declared_hours``, the replay runs for ``run_s``."""

    job_id: int
    submit_s: float
    run_s: float
    gpus: int
    declared_hours: float
    team: str
    min_gpus: int | None = None  # never set by the readers: for synthetic workloads
    preemptible: bool = False
    checkpoints: bool = False  # a preempted run resumes from its last checkpoint (else it starts over)
    max_gpus: int | None = None  # elastic: may start this wide; a wider run is proportionally shorter


@dataclass(slots=True)
class Trace:
    """Jobs in submit order, plus what the reader assumed and the machine it came from, if known."""

    name: str
    jobs: list[TraceJob]
    skipped: int = 0
    notes: list[str] = field(default_factory=list)
    machine_gpus: int | None = None  # the original machine in GPUs, when the trace says


def read_trace(path: str | Path, *, procs_per_gpu: int = 1, itp_overestimate: float = 1.0) -> Trace:
    """Pick the reader by file name: ``.swf``/``.swf.gz`` or ``.csv`` (ITP)."""
    path = Path(path)
    name = path.name
    if name.endswith((".swf", ".swf.gz")):
        return read_swf(_lines(path), name=name, procs_per_gpu=procs_per_gpu)
    if name.endswith(".csv"):
        return read_itp(_lines(path), name=name, overestimate=itp_overestimate)
    raise ValueError(f"unknown trace format for {name}: expected .swf, .swf.gz or .csv")


def _lines(path: Path) -> Iterable[str]:
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        raw = gzip.decompress(raw)
    return io.StringIO(raw.decode("utf-8", errors="replace"))


# --------------------------------------------------------------------------- SWF


def read_swf(lines: Iterable[str], *, name: str = "trace.swf", procs_per_gpu: int = 1) -> Trace:
    """Parse SWF: 2 submit, 4 run time, 5 allocated procs (8 requested if -1), 9 requested time, 12 user.

    GPUs = ceil(procs / procs_per_gpu). The default, 1, maps one 8-core node to one 8-GPU node,
    so a machine of N 8-core nodes becomes N 8-GPU nodes at the same offered load. Jobs with
    run time <= 0 or no processors are skipped (counted). The declaration (estimate) is
    max(requested time, run time), the field's usual convention: a job that overran its request
    was let run that long, so its true limit was at least its run; -1 (no request) gives the run
    time. The user id becomes the team ``user-<id>``.
    """
    jobs: list[TraceJob] = []
    header: dict[str, str] = {}
    skipped = no_request = overran = 0
    for line in lines:
        line = line.strip()
        if not line:
            continue
        if line.startswith(";"):
            key, _, value = line[1:].partition(":")
            header[key.strip()] = value.strip()
            continue
        f = line.split()
        if len(f) < 12:
            skipped += 1
            continue
        run, procs = float(f[3]), int(f[4])
        if procs <= 0:
            procs = int(f[7])
        if run <= 0 or procs <= 0:
            skipped += 1
            continue
        requested = float(f[8])
        if requested <= 0:
            requested, no_request = run, no_request + 1
        elif requested < run:
            overran += 1
        requested = max(requested, run)
        jobs.append(
            TraceJob(
                job_id=int(f[0]),
                submit_s=float(f[1]),
                run_s=run,
                gpus=math.ceil(procs / procs_per_gpu),
                declared_hours=requested / HOUR_S,
                team=f"user-{f[11]}",
            )
        )
    jobs.sort(key=lambda j: j.submit_s)  # stable: trace order among equal submit times
    notes = [
        f"SWF: GPUs = ceil(processors / {procs_per_gpu}); teams = SWF user ids; "
        f"declared hours = max(SWF requested time, run time) for every policy ({overran} jobs overran "
        f"their request; {no_request} without one use their run time)",
        f"SWF: skipped {skipped} jobs with run time <= 0 or no processors",
    ]
    return Trace(
        name=name, jobs=jobs, skipped=skipped, notes=notes, machine_gpus=_machine_gpus(header, procs_per_gpu)
    )


def _machine_gpus(header: dict[str, str], procs_per_gpu: int) -> int | None:
    try:
        return int(header["MaxProcs"]) // procs_per_gpu
    except (KeyError, ValueError):
        return None


# --------------------------------------------------------------------------- ITP


def itp_team(job_key: str, *, teams: int = 8) -> str:
    """A stable team for a job of a trace without users: CRC-32 of its id, modulo ``teams``."""
    return f"team-{zlib.crc32(job_key.encode()) % teams}"


def itp_declared_hours(duration_s: float, *, overestimate: float = 1.0) -> float:
    """The declared limit: duration x ``overestimate``, rounded up to a whole hour (at least 1 h).

    Limits are declared in whole hours in this product, so rounding the true duration up is the
    tightest declaration a user could make; ``overestimate`` > 1 models looser users.
    """
    return max(1.0, math.ceil(duration_s * overestimate / HOUR_S - 1e-9))


def read_itp(
    lines: Iterable[str], *, name: str = "trace.csv", teams: int = 8, overestimate: float = 1.0
) -> Trace:
    """Parse ``job_id,submission_time,duration,num_gpu``; rows without GPUs or duration are skipped."""
    jobs: list[TraceJob] = []
    skipped = 0
    for n, row in enumerate(csv.DictReader(lines), start=1):
        try:
            submit, run, gpus = float(row["submission_time"]), float(row["duration"]), int(row["num_gpu"])
        except (KeyError, TypeError, ValueError):
            skipped += 1
            continue
        if run <= 0 or gpus <= 0:
            skipped += 1
            continue
        jobs.append(
            TraceJob(
                job_id=n,
                submit_s=submit,
                run_s=run,
                gpus=gpus,
                declared_hours=itp_declared_hours(run, overestimate=overestimate),
                team=itp_team(row["job_id"], teams=teams),
            )
        )
    jobs.sort(key=lambda j: j.submit_s)
    factor = f"{overestimate:g} x duration" if overestimate != 1.0 else "duration"
    notes = [
        f"ITP: no users in the trace; team = CRC-32(job_id) mod {teams} (stable, {teams} teams)",
        f"ITP: no time limits in the trace; declared hours = {factor} rounded up to a whole hour "
        "(the tightest whole-hour limit a user could declare)",
        f"ITP: skipped {skipped} rows without GPUs or duration",
    ]
    return Trace(name=name, jobs=jobs, skipped=skipped, notes=notes)
