"""Reads the pool into the scheduling policy's plain views (``jobs.planning`` stores what it said).

The policy core knows nothing of Django; this module and ``jobs.planning`` are the only
translation between rows and its dataclasses, so the live scheduler and the trace simulator run
the same policy.
"""

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models.functions import Coalesce

from accounts.models import Team
from common import schema
from jobs import dependencies, limits, rental, selectors
from jobs.lifecycle import BEFORE_RENT, HOLDS_COMPUTE, State
from jobs.models import Allocation, DataInput, GpuHold, ImagePull, Job, Node, TeamUsage
from jobs.scheduling import prediction, types


@dataclass(frozen=True)
class PoolView:
    nodes: list[types.NodeView]
    running: list[types.RunningView]
    pending: list[types.PendingJob]
    usage: dict[str, float]
    shares: dict[str, float]
    config: types.PolicyConfig
    requested_gpus: dict[int, int]


def config() -> types.PolicyConfig:
    return types.PolicyConfig(half_life_s=settings.E31_FAIRSHARE_HALF_LIFE_S)


def take(*, now: datetime) -> PoolView:
    """One consistent read of nodes, holds, running allocations, the queue and usage.

    Pending and running jobs are planned with their team's learned run times (never past their
    declared limit, which the node agent enforces as the deadline); pending jobs are ranked by their
    declared hours (``prediction.planned``)."""
    pending, running = _pending(now), _running()
    learned = selectors.learned_run_times([j.team for j in [*pending, *running]])
    return PoolView(
        nodes=_nodes(now, frozenset().union(*(p.datasets for p in pending))),
        running=[_as_predicted(r, learned[r.team], now) for r in running],
        pending=[prediction.planned(p, learned[p.team]) for p in pending],
        usage=_usage(now),
        shares=dict(Team.objects.values_list("name", "share")),
        config=config(),
        requested_gpus={p.job_id: p.gpus for p in pending},
    )


# A job past its deadline still holds its GPUs until its agent stops it (TERM, then the kill grace) and its
# outputs are sealed and released: it is planned to end this long from now, never before now, or a job waiting
# for its GPUs would be told a start that has already passed.
OVERDUE_MARGIN_S = 60.0


def _as_predicted(r: types.RunningView, learned: prediction.Learned, now: datetime) -> types.RunningView:
    limit_s = r.expected_end - r.started_at
    end = prediction.planned_end(learned, started_at=r.started_at, limit_s=limit_s, now=now.timestamp())
    return replace(r, expected_end=max(end, now.timestamp() + OVERDUE_MARGIN_S))


def _nodes(now: datetime, pool_cached: frozenset[str] = frozenset()) -> list[types.NodeView]:
    """``pool_cached``: the waiting jobs' datasets in the pool-wide staging cache, which every node reads.
    A node takes work when up, its agent runs this process's code (during an upgrade, until the agent is
    restarted on the same checkout, it would run a job with rows shaped for the other schema), not while
    its disk has just failed to hold an attempt's space, and not once silent past E31_NODE_TIMEOUT_S (the reaper
    about to declare it down)."""
    silent_since = rental.silent_since(now)
    held: dict[int, set[int]] = defaultdict(set)
    for node_id, index in GpuHold.objects.filter(active=True).values_list("node_id", "gpu_index"):
        held[node_id].add(index)
    nodes = list(
        Node.objects.exclude(state=Node.NodeState.DOWN).only(
            "id", "name", "gpus", "state", "memory_bytes", "cpus", "multi_node_refusal", "no_room_until",
            "disk_free_bytes", "disk_free_at", "disk_bytes", "gpu_model", "agent_version", "last_heartbeat",
        )
    )  # fmt: skip
    used = _held_by_parts({node.id: node for node in nodes})
    present = selectors.present_gpus({node.id: node.gpus for node in nodes})
    version = schema.code().version
    return [
        types.NodeView(
            name=node.name,
            gpus=node.gpus,
            free=tuple(i for i in present[node.id] if i not in held[node.id]),
            schedulable=node.state == Node.NodeState.UP
            and node.agent_version == version
            and not (node.no_room_until and node.no_room_until > now)
            and not (node.last_heartbeat and node.last_heartbeat < silent_since),
            cached_datasets=pool_cached,
            memory=node.memory_bytes,
            cpus=node.cpus,
            free_memory=node.memory_bytes - used[node.id][0],
            free_cpus=node.cpus - used[node.id][1],
            spans=not node.multi_node_refusal,
            free_disk=None if node.disk_free_bytes is None else node.disk_free_bytes - used[node.id][2],
            disk=node.disk_bytes,
            gpu_model=node.gpu_model,
        )
        for node in nodes
    ]


# A part's attempt space is made on its node's disk within seconds of the part's start: a measure of the disk
# taken this long after the start holds it. Parts started later (or not yet) are taken off the measure; counted
# twice for a while, a space only steers the next placement elsewhere.
SPACE_MADE_S = 60


def _held_by_parts(nodes: dict[int, Node]) -> dict[int, tuple[float, float, int]]:
    """Per node: the memory and CPUs its unreleased parts hold (each part's share, as the agent enforces it),
    and the attempt spaces of those its last measure of the disk does not hold yet."""
    used: dict[int, tuple[float, float, int]] = defaultdict(lambda: (0.0, 0.0, 0))
    rows = Allocation.objects.filter(released_at__isnull=True).values_list(
        "node_id", "gpu_indices", "job_id", "job__memory_bytes", "job__cpus", "started_at", "job__output_bytes"
    )  # fmt: skip
    # GPUs each job's attempt holds in all: what its declaration splits over
    held: dict[int, int] = defaultdict(int)
    for _node_id, indices, job_id, *_ in rows:
        held[job_id] += len(indices)
    for node_id, indices, job_id, memory, cpus, started_at, output_bytes in rows:
        if node_id not in nodes:
            continue
        node = nodes[node_id]
        shape = {"job_gpus": held[job_id], "node_gpus": node.gpus, "gpus_here": len(indices)}
        measured = node.disk_free_at
        unmeasured = measured is not None and (
            started_at is None or started_at > measured - timedelta(seconds=SPACE_MADE_S)
        )
        memory_used, cpus_used, disk_used = used[node_id]
        used[node_id] = (
            memory_used + types.part_share(declared=memory, node_total=node.memory_bytes, **shape),
            cpus_used + types.part_share(declared=cpus, node_total=node.cpus, **shape),
            disk_used + (limits.space_bytes(output_bytes) if unmeasured else 0),
        )
    return used


def _running() -> list[types.RunningView]:
    """Jobs holding GPUs, each planned from when its process started: the agent stops a part at its own start +
    the declared hours, and a node may pick its part up well after the rent (not started yet: from the rent)."""
    by_job: dict[int, dict] = {}
    rows = Allocation.objects.filter(released_at__isnull=True, job__state__in=HOLDS_COMPUTE).values_list(
        "job_id",
        "job__team__name",
        "node__name",
        "gpu_indices",
        "rented_at",
        "started_at",
        "job__hours",
        "job__preemptible",
        Coalesce("job__array__limit_of_id", "job__array_id"),  # a requeued task counts against its array
        "job__checkpoint_signal",
        "job__checkpoint_grace_s",
        "job__preempt_requested_at",
    )
    for (
        job_id,
        team,
        node,
        indices,
        rented_at,
        started_at,
        hours,
        preemptible,
        array,
        signal,
        grace,
        asked,
    ) in rows:
        entry = by_job.setdefault(
            job_id,
            {
                "team": team,
                "nodes": {},
                "started": 0.0,
                "hours": hours,
                "preemptible": preemptible,
                "array": array,
                "checkpoints": bool(signal),
                # what a preemption asks of it: its checkpoint's grace, or TERM and the kill grace
                "yield_s": grace if signal else settings.E31_KILL_GRACE_S,
                "asked": asked.timestamp() if asked else None,
            },
        )
        entry["nodes"][node] = tuple(indices)
        # the job holds its GPUs until its last part to start is stopped
        entry["started"] = max(entry["started"], (started_at or rented_at).timestamp())
    return [
        types.RunningView(
            job_id=job_id,
            team=e["team"],
            gpus_by_node=e["nodes"],
            started_at=e["started"],
            expected_end=e["started"] + e["hours"] * 3600,
            preemptible=e["preemptible"],
            array=e["array"],
            checkpoints=e["checkpoints"],
            yield_s=e["yield_s"],
            preempt_asked_at=e["asked"],
        )
        for job_id, e in by_job.items()
    ]


# A staging job's transfers are planned to take this long until they say how many bytes are left: a job
# without rows yet, or an image pull still resolving its reference (its size not learned).
ASSUMED_STAGING_S = 60.0
# The RENT refuses a job that is not QUEUED: one still staging is planned at least this far ahead, never now,
# so the GPUs a start of it would take this pass go to a queued job instead.
NOT_QUEUED_READY_S = 1.0
SIZE_KNOWN = (
    "staged",
    "cached",
)  # image pull states after its size was learned (0 bytes then means nothing to move)


# The columns a waiting job is planned by, as submitting stores them (``services.declared_fields``).
PLANNED = (
    "gpus", "hours", "min_gpus", "max_gpus", "preemptible", "memory_bytes", "cpus", "output_bytes", "gpu_model",
)  # fmt: skip


def pending_job(
    declared: Mapping[str, Any], *, job_id: int, team: str, submitted_at: float, **facts
) -> types.PendingJob:
    """A waiting job as the policy sees it: what it declared (its ``PLANNED`` columns), and ``facts`` of the moment
    (when its data is in place, its cached datasets, the prerequisites it waits for, its array). The pass reads every
    queued job through it, and the submit form's preview its draft, so the two cannot plan one job differently."""
    return types.PendingJob(
        job_id=job_id, team=team, submitted_at=submitted_at, gpus=declared["gpus"], hours=declared["hours"],
        min_gpus=declared["min_gpus"], max_gpus=declared["max_gpus"], preemptible=declared["preemptible"],
        memory=declared["memory_bytes"], cpus=declared["cpus"], space=limits.space_bytes(declared["output_bytes"]),
        gpu_model=declared["gpu_model"] or None, **facts,
    )  # fmt: skip


def _pending(now: datetime) -> list[types.PendingJob]:
    """Queued jobs are ready; staging ones are planned from their staging ETA, never before the next pass; a job
    waiting for prerequisites, from their ends and its staging then. Each names the GPU model it asked for."""
    jobs = Job.objects.filter(state__in=(State.QUEUED, State.STAGING, State.SUBMITTED)).values_list(
        "id", "team__name", "submitted_at", "state", Coalesce("array__limit_of_id", "array_id"),
        "array__max_running", *PLANNED,
    )  # fmt: skip
    etas = staging_etas(now)
    unknown, not_before = now.timestamp() + ASSUMED_STAGING_S, now.timestamp() + NOT_QUEUED_READY_S
    datasets = selectors.job_datasets([row[0] for row in jobs])
    # A job held by prerequisites ages from when they ended, not from its submission (``standing_of``).
    waits, eligible = dependencies.standing_of(row[0] for row in jobs)
    return [
        pending_job(
            dict(zip(PLANNED, declared, strict=True)), job_id=job_id, team=team,
            submitted_at=max(submitted, eligible.get(job_id, submitted)).timestamp(),
            ready_at=None if state == State.QUEUED else max(etas.get(job_id, unknown), not_before),
            datasets=datasets.get(job_id, frozenset()), waits_for=waits.get(job_id, ()), array=array,
            array_limit=array_limit, stage_s=_stage_s(job_id, state, waits, etas, now),
        )
        for job_id, team, submitted, state, array, array_limit, *declared in jobs
    ]  # fmt: skip


def _stage_s(job_id: int, state: str, waits: dict, etas: dict[int, float], now: datetime) -> float:
    """How long a job waiting for prerequisites, not staged yet (it stages once they end), should take to stage:
    from its inputs' and image's bytes where they are known, else 0 (not known)."""
    if state != State.SUBMITTED or job_id not in waits or job_id not in etas:
        return 0.0
    return max(etas[job_id] - now.timestamp(), 0.0)


def staging_etas(now: datetime) -> dict[int, float]:
    """When each staging job's data should be in place, from its inputs' bytes left and rates: its image, then each
    input, one after another (jobs.staging), so the times add up."""
    left: dict[int, float] = defaultdict(float)
    rows = DataInput.objects.filter(job__state__in=BEFORE_RENT).values_list(
        "job_id", "bytes", "bytes_done", "rate_bytes_s"
    )
    pulls = ImagePull.objects.filter(job__state__in=BEFORE_RENT).values_list(
        "job_id", "bytes", "bytes_done", "rate_bytes_s", "stage_state"
    )
    for job_id, size, done, rate in rows:
        left[job_id] += _seconds_left(size, done, rate)
    for job_id, size, done, rate, stage_state in pulls:
        seconds = _seconds_left(size, done, rate)
        if not size and stage_state not in SIZE_KNOWN:  # resolving its reference: size not known yet
            seconds = max(seconds, ASSUMED_STAGING_S)
        left[job_id] += seconds
    return {job_id: now.timestamp() + seconds for job_id, seconds in left.items()}


def staged_at(sizes: Iterable[int], *, now: datetime) -> float | None:
    """When inputs of these sizes, none moved yet, should be in place, as a pass plans a job just submitted with them
    (``staging_etas``); None: nothing to move."""
    seconds = sum(_seconds_left(size, 0, 0.0) for size in sizes if size)
    return now.timestamp() + max(seconds, NOT_QUEUED_READY_S) if seconds else None


def _seconds_left(size: int, done: int, rate: float) -> float:
    return (size - done) / (rate if rate > 0 else settings.E31_ASSUMED_STAGE_RATE)


def _usage(now: datetime) -> dict[str, float]:
    """Each team's decayed GPU-seconds: released work folded into TeamUsage, plus what is held now."""
    usage = {u.team.name: u.decayed(now) for u in TeamUsage.objects.select_related("team")}
    for team, rented_at, indices in Allocation.objects.filter(released_at__isnull=True).values_list(
        "job__team__name", "rented_at", "gpu_indices"
    ):
        usage[team] = usage.get(team, 0.0) + (now - rented_at).total_seconds() * len(indices)
    return usage
