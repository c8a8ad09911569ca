"""The interface of the scheduling core: what a policy is shown, what it answers, its knobs.

Pure data (standard library only). The default policy (``jobs.scheduling.policy.plan``) and every
baseline (``jobs.scheduling.baselines``) have the ``Policy`` signature, and nothing else in common:
the live scheduler and the trace replay call any of them the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from operator import attrgetter
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from jobs.scheduling.placement import PoolState

HOUR_S = 3600.0
DAY_S = 86400.0


@dataclass(frozen=True, slots=True)
class NodeView:
    """One GPU node as the scheduler sees it now."""

    name: str
    gpus: int
    free: tuple[int, ...]
    schedulable: bool = True
    cached_datasets: frozenset[str] = frozenset()
    # Memory (bytes) and CPUs the node offers to jobs, and what its running parts leave free.
    # 0 offered: not advertised (trace replays without them), and placement ignores it.
    memory: float = 0
    cpus: float = 0
    free_memory: float = 0
    free_cpus: float = 0
    spans: bool = True  # may hold a part of a job spanning nodes (it can isolate their network)
    # Bytes its disk can still give attempt spaces (as its agent last measured it, less the spaces of parts
    # placed since); None: not reported (a node that does not bound spaces, trace replays): not a limit.
    free_disk: float | None = None
    # Bytes that disk holds in all: a space larger can never be made there, however much frees. 0: not said.
    disk: float = 0
    gpu_model: str = ""  # as its agent reported it ("NVIDIA H100 80GB HBM3"); "": not said (trace replays)


@dataclass(frozen=True, slots=True)
class RunningView:
    """A job holding GPUs now; ``expected_end`` is when the scheduler plans it to end: its process's start
    (its rent until it starts) + declared hours, or + its team's learned run time (``prediction``), never past
    the declared limit."""

    job_id: int
    team: str
    gpus_by_node: dict[str, tuple[int, ...]]
    started_at: float
    expected_end: float
    preemptible: bool = False
    array: int | None = None  # the array it is a task of, whose running limit it counts against
    # Resumes from its last checkpoint when stopped: cheap to preempt, so it makes room first.
    checkpoints: bool = False
    # Once preempted, how long it may take to give its GPUs back: its checkpoint's grace, else the kill grace.
    yield_s: float = 0.0
    preempt_asked_at: float | None = None  # when its preemption was asked, by an earlier pass


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A queued (or still staging) job; ``hours`` is the run time the scheduler plans with: the declared
    limit, or its team's learned prediction (``prediction``), never more than the limit. ``limit_hours`` is
    the declared limit when ``hours`` is a prediction (None: ``hours`` is the declaration): what the job is
    ranked by (``ranked_hours``), since a team's learned run times are for backfill and estimated starts only."""

    job_id: int
    team: str
    gpus: int
    hours: float
    submitted_at: float
    min_gpus: int | None = None
    preemptible: bool = False
    ready_at: float | None = None
    max_gpus: int | None = None  # elastic: may start this wide on GPUs nothing else waits for (``widening``)
    datasets: frozenset[str] = frozenset()
    memory: float | None = None  # for the whole job (see ``part_share``); None: each node's share
    cpus: float | None = None
    # Prerequisites not yet ended as required: (job id, "succeed" or "end"). Held back while any is left.
    waits_for: tuple[tuple[int, str], ...] = ()
    # A task of array ``array``, of which at most ``array_limit`` run at once (None: no limit).
    array: int | None = None
    array_limit: int | None = None
    space: float = 0  # bytes each of its parts takes on its node's disk (its attempt space)
    # The GPU model it asked for, placed only on nodes that have it (``serves``); None: any node.
    gpu_model: str | None = None
    # Waiting for prerequisites, it stages only once they end: how long its staging is planned to take then
    # (0: not known, or nothing to stage).
    stage_s: float = 0.0
    limit_hours: float | None = None
    # A memo, not part of the job: its priority terms that do not change while it waits, for one config,
    # (config, A, L, slow, team), written once by ``priority`` (``jobs.scheduling.priority.remember_terms``).
    rank_terms: tuple[object, float, float, float, str] = field(
        default=(None, 0.0, 0.0, 0.0, ""), init=False, repr=False, compare=False
    )


def ranked_hours(job: PendingJob) -> float:
    """The hours a job is ranked by: its declared limit, never its team's learned prediction, or a team could
    raise its priority by teaching the scheduler short run times."""
    return job.hours if job.limit_hours is None else job.limit_hours


def serves(node_model: str, asked: str) -> bool:
    """Whether a node of ``node_model`` has the model a job asked for (the rule intake holds a model by): "H100"
    names "NVIDIA H100 80GB HBM3", case aside, as whole words: "A10" is not an A100, nor "L4" an L40S."""
    return _model_pattern(asked).search(node_model) is not None


@lru_cache(maxsize=256)
def _model_pattern(asked: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![a-z0-9]){re.escape(asked.strip())}(?![a-z0-9])", re.IGNORECASE)


def part_share(
    *, declared: float | None, job_gpus: int, node_total: float, node_gpus: int, gpus_here: int
) -> float:
    """Memory or CPUs one part of a job gets: the declared amount for the whole job split across its
    nodes by GPUs, or undeclared, the node's share for the GPUs held there (half of a node's memory
    for half its GPUs). The scheduler places by it and the node agent enforces it."""
    if declared is not None:
        return declared * gpus_here / max(job_gpus, 1)
    return node_total * gpus_here / max(node_gpus, 1)


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Knobs of the default policy (see the module docstring for how they combine).

    ``length_weight`` scales S in (0, 1]: a 10-minute job gets 0.8, a 1-hour job 0.5, a 3-day job
    0.14. ``age_weight`` is priority per day waited: at 0.25, four days of waiting outweigh the
    whole length range. ``slowdown_weight`` scales the job's expected slowdown so far,
    wait / declared hours (at least 15 minutes): at 0.3 a 1-hour job that waited an hour gains as
    much as 1.2 days of age - short jobs, whose slowdown suffers most from a wait, go first.
    A job is starved after ``starvation_factor`` times the queue's mean wait, and at least
    ``starvation_s``: relative, so an overloaded queue, where every wait is long, keeps its order
    instead of decaying into oldest-first; factor 0 makes ``starvation_s`` a fixed bound.
    ``starvation_max_s`` caps the relative bound: a queue that only grows (every job's wait
    rising with the mean) would otherwise never starve anyone.
    ``fairshare_weight`` scales F in (0, 1]; at 0.2 a team far over its share loses about as much
    as 19 hours of waiting - it orders similar jobs, it is not a wall: in trace replays heavier
    weights made teams' slowdowns less equal, not more.
    ``max_reservations`` caps reservations per pass (starved jobs beyond it get theirs once those
    ahead start). At 1, EASY's rule: with several holds, backfilling turned conservative and lost
    to EASY on RICC (mean bounded slowdown 81.6 against 64.3 with 6 holds, 26.5 with one). ``explain=False`` skips estimates, reasons and the priority breakdown (the
    simulator's setting); starts, preemptions and reservations are the same either way.
    """

    half_life_s: float = 7 * DAY_S
    fairshare_weight: float = 0.2
    age_weight: float = 0.25
    length_weight: float = 1.0
    starvation_s: float = 6 * HOUR_S
    starvation_factor: float = 4.0
    starvation_max_s: float = 7 * DAY_S
    slowdown_weight: float = 0.3
    reserve_top: int = 1
    max_reservations: int = 1
    explain: bool = True


DEFAULT_CONFIG = PolicyConfig()


@dataclass(frozen=True, slots=True)
class Start:
    """Start ``job_id`` now on these GPUs (an elastic job may hold fewer than it asked for)."""

    job_id: int
    gpus_by_node: dict[str, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class Reservation:
    """GPUs held for ``job_id`` from ``start_at`` (declared-hours bound); ``None`` = not computed."""

    job_id: int
    start_at: float
    gpus_by_node: dict[str, tuple[int, ...]] | None


@dataclass(frozen=True, slots=True)
class Estimate:
    """When a pending job should start, as a code and a sentence for its owner."""

    job_id: int
    start_at: float | None
    reason_code: str
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    """The outcome of one pass; the caller applies starts and preemptions."""

    starts: list[Start]
    preemptions: list[int]
    reservations: list[Reservation]
    estimates: dict[int, Estimate]
    priority: dict[int, dict[str, float]]


class NodeList(list[NodeView]):
    """The pool's nodes, all schedulable, with totals their keeper maintains as GPUs come and go.

    The replay hands one to every pass so that a policy need not count 1,000 nodes each time; the
    live scheduler hands a plain list, and a policy then counts for itself. ``with_free`` holds the
    positions of nodes with at least one free GPU. ``state``, when the keeper keeps one, is the
    engine's view of the free GPUs (``placement.PoolState``), kept up to date the same way.
    """

    free_gpus: int
    total_gpus: int
    with_free: dict[int, None]
    state: PoolState | None = None


class RunningList(list[RunningView]):
    """Running jobs that their keeper keeps in expected-end order (ties by job id), with how many
    are preemptible and, when it counts them, how many each team runs (``teams``: no zero counts).
    The replay hands one to every pass, so a policy neither sorts nor scans them again; the live
    scheduler hands a plain list, and a policy then does both itself. ``held``, when kept, is
    parallel to the list: how many GPUs each job holds, so that a walk over the releases need not
    count them job by job."""

    preemptible: int = 0
    teams: Mapping[str, int] | None = None
    held: list[int] | None = None


class PendingList(list[PendingJob]):
    """Queued jobs that their keeper keeps in submit order (``submitted_at``, then job id) while
    ``by_submit`` holds: a first-come policy then need not sort them. ``ready``: none is still
    staging (no ``ready_at``); ``largest``: no job asks for more GPUs (None: not known); ``ungated``:
    none waits for a prerequisite or is an array task with a running limit; ``teams``: how many jobs
    each team has queued (no zero counts; None: not counted); ``sizes``: how many queued jobs ask
    for each GPU count, ``gpus`` (no zero counts; None: not counted) - facts the replay knows for free, so
    that a policy need not scan the whole queue for them each pass."""

    by_submit: bool = False
    ready: bool = False
    largest: int | None = None
    ungated: bool = False
    teams: Mapping[str, int] | None = None
    sizes: Mapping[int, int] | None = None


def gpus_held(gpus_by_node: Mapping[str, Sequence[int]]) -> int:
    """How many GPUs a start or a running job holds, over all its nodes."""
    return sum(map(len, gpus_by_node.values()))


def smallest_request(pending: Sequence[PendingJob]) -> int:
    """The fewest GPUs (``gpus``, not an elastic job's ``min_gpus``) any queued job asks for, from the
    keeper's counts (1 when not counted: every job asks for at least one), so that a policy that
    starts jobs at full size can skip looking for a fit with fewer GPUs free."""
    if isinstance(pending, PendingList) and pending.sizes:
        return min(pending.sizes)
    return 1


def teams_present(pending: Sequence[PendingJob], running: Sequence[RunningView]) -> set[str]:
    """Teams with a queued or running job: from the keepers' counts where they keep them."""
    queued = pending.teams if isinstance(pending, PendingList) else None
    held = running.teams if isinstance(running, RunningList) else None
    teams = set(map(_team, pending)) if queued is None else set(queued)
    return teams.union(map(_team, running) if held is None else held)


def by_expected_end(running: Sequence[RunningView]) -> Sequence[RunningView]:
    """``running`` in expected-end order (stable: ties keep their order)."""
    return running if isinstance(running, RunningList) else sorted(running, key=_expected_end)


def any_preemptible(running: Sequence[RunningView]) -> bool:
    if isinstance(running, RunningList):
        return running.preemptible > 0
    return any(map(_preemptible, running))


def by_submit(pending: Sequence[PendingJob]) -> list[PendingJob]:
    """``pending`` in submit order (then job id), as a new list."""
    if isinstance(pending, PendingList) and pending.by_submit:
        return list(pending)
    return sorted(pending, key=_submit_key)


_expected_end = attrgetter("expected_end")
_preemptible = attrgetter("preemptible")
_team = attrgetter("team")
_submit_key = attrgetter("submitted_at", "job_id")


# A running job's release events, (expected end, node, GPUs), by job id with the view they were
# computed from. The caller owns it and may keep it across passes (the replay does: a running job's
# releases never change); ``plan()``'s result never depends on what it holds.
ReleaseMemo = dict[int, tuple[RunningView, list[tuple[float, str, int]]]]


class Policy(Protocol):
    """One scheduling pass: what to start now, what to preempt, what to reserve, when the rest start."""

    def __call__(
        self,
        *,
        now: float,
        nodes: Sequence[NodeView],
        running: Sequence[RunningView],
        pending: Sequence[PendingJob],
        usage: Mapping[str, float],
        shares: Mapping[str, float],
        config: PolicyConfig = ...,
        memo: ReleaseMemo | None = None,
    ) -> Plan: ...
