"""Textbook reference policies: FCFS, EASY and SJF-EASY on a flat pool of GPUs.

Plain and separate on purpose: they share only the ``Policy`` type with the default policy (no
engine, no placement rules, no priority), so that the default policy is compared with the field's
baselines, not with variants of its own engine. The pool is one flat set of GPUs: node boundaries
are ignored and a job may take free GPUs on any nodes. That is the textbook model; on a pool of
1-GPU nodes it is also exact, which is how the node-aware engine is checked against it.

- ``fcfs``: start jobs in submit order; stop at the first one that does not fit.
- ``easy`` (EASY backfilling, Mu'alem and Feitelson 2001): FCFS order; the first job that does
  not fit (the head) gets one reservation at the earliest time enough GPUs are free by the
  running jobs' estimated ends (the shadow time); every later job that fits now starts if it
  ends by the shadow time or uses only GPUs the head does not need then (the extra GPUs).
- ``sjf_easy``: the same, the queue ordered by estimate (shortest first, then submit order).

Estimates are the jobs' declared hours; the replay derives them once, the same way for every
policy (``jobs.scheduling.traces``). A running job past its estimate counts as ending now. Hints
the textbook lacks are ignored (an elastic job runs at full size, a backlog job is an ordinary
one); a job still staging (``ready_at`` later) is not in the queue yet; a job larger than the
schedulable pool is skipped, never waited for.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import compress, count, repeat
from operator import attrgetter, le

from jobs.scheduling.types import (
    DEFAULT_CONFIG,
    HOUR_S,
    NodeView,
    PendingJob,
    Plan,
    PolicyConfig,
    ReleaseMemo,
    Reservation,
    RunningView,
    Start,
)

_by_submit = attrgetter("submitted_at", "job_id")
_by_estimate = attrgetter("hours", "submitted_at", "job_id")
_expected_end = attrgetter("expected_end")
_gpus = attrgetter("gpus")


class _FlatPool:
    """The free GPUs of schedulable nodes as one count, handed out in node order."""

    def __init__(self, nodes: Sequence[NodeView]) -> None:
        usable = [n for n in nodes if n.schedulable]
        self.schedulable = {n.name for n in usable}
        self.capacity = sum(map(_gpus, usable))
        self.free = sum(len(n.free) for n in usable)
        self._next: Iterator[tuple[str, int]] = ((n.name, i) for n in usable for i in n.free)

    def start(self, job: PendingJob) -> Start:
        taken: dict[str, list[int]] = {}
        for _ in range(job.gpus):
            node, index = next(self._next)
            taken.setdefault(node, []).append(index)
        self.free -= job.gpus
        return Start(job_id=job.job_id, gpus_by_node={n: tuple(ix) for n, ix in taken.items()})


def _queue(
    pending: Sequence[PendingJob], *, now: float, pool: _FlatPool, key: attrgetter
) -> list[PendingJob]:
    """The jobs that can ever start, in the policy's order (staging ones are not queued yet)."""
    return sorted(
        (j for j in pending if j.gpus <= pool.capacity and (j.ready_at is None or j.ready_at <= now)),
        key=key,
    )


def _plan(starts: list[Start], reservations: list[Reservation]) -> Plan:
    return Plan(starts=starts, preemptions=[], reservations=reservations, estimates={}, priority={})


def fcfs(
    *,
    now: float,
    nodes: Sequence[NodeView],
    running: Sequence[RunningView],
    pending: Sequence[PendingJob],
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    config: PolicyConfig = DEFAULT_CONFIG,
    memo: ReleaseMemo | None = None,
) -> Plan:
    """Strict first-come-first-served: start in submit order, stop at the first job that waits."""
    pool = _FlatPool(nodes)
    starts = []
    for job in _queue(pending, now=now, pool=pool, key=_by_submit):
        if job.gpus > pool.free:
            break
        starts.append(pool.start(job))
    return _plan(starts, [])


def shadow_time(
    head: PendingJob, *, now: float, free: int, releases: Sequence[tuple[float, int]]
) -> tuple[float, int]:
    """EASY's reservation for ``head``: the earliest time enough GPUs are free, and the GPUs
    beyond its need free then (``releases``: (estimated end, GPUs) in end order)."""
    avail, at, k = free, now, 0
    while avail < head.gpus:
        if k == len(releases):
            raise ValueError(f"job {head.job_id} needs {head.gpus} GPUs; the pool never frees them")
        end, gpus = releases[k]
        avail, at, k = avail + gpus, max(end, now), k + 1
    while k < len(releases) and releases[k][0] <= at:  # others ending at that very moment add extra
        avail, k = avail + releases[k][1], k + 1
    return at, avail - head.gpus


def _releases(
    running: Sequence[RunningView], started: Sequence[tuple[float, int]], pool: _FlatPool
) -> list[tuple[float, int]]:
    """(estimated end, GPUs on schedulable nodes) of running jobs and this pass's starts, by end."""
    out = [
        (r.expected_end, sum(len(ix) for n, ix in r.gpus_by_node.items() if n in pool.schedulable))
        for r in sorted(running, key=_expected_end)
    ]
    if started:
        out = sorted(out + list(started))
    return out


def _easy(queue: list[PendingJob], *, now: float, running: Sequence[RunningView], pool: _FlatPool) -> Plan:
    """EASY over ``queue`` (already in the policy's order): one reservation, then backfill."""
    starts: list[Start] = []
    ends: list[tuple[float, int]] = []
    i = 0
    while i < len(queue) and queue[i].gpus <= pool.free:
        starts.append(pool.start(queue[i]))
        ends.append((now + queue[i].hours * HOUR_S, queue[i].gpus))
        i += 1
    if i == len(queue):
        return _plan(starts, [])
    head, rest = queue[i], queue[i + 1 :]
    shadow, extra = shadow_time(head, now=now, free=pool.free, releases=_releases(running, ends, pool))
    if pool.free and rest:
        # A C-level size test first: on a busy pool few jobs fit what is free.
        for k in compress(count(), map(le, map(_gpus, rest), repeat(pool.free))):
            job = rest[k]
            if job.gpus > pool.free:
                continue
            past_shadow = now + job.hours * HOUR_S > shadow
            if past_shadow and job.gpus > extra:
                continue  # would delay the head's reservation
            starts.append(pool.start(job))
            extra -= job.gpus if past_shadow else 0
            if not pool.free:
                break
    return _plan(starts, [Reservation(job_id=head.job_id, start_at=shadow, gpus_by_node=None)])


def easy(
    *,
    now: float,
    nodes: Sequence[NodeView],
    running: Sequence[RunningView],
    pending: Sequence[PendingJob],
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    config: PolicyConfig = DEFAULT_CONFIG,
    memo: ReleaseMemo | None = None,
) -> Plan:
    """EASY backfilling in submit order (the module docstring)."""
    pool = _FlatPool(nodes)
    return _easy(_queue(pending, now=now, pool=pool, key=_by_submit), now=now, running=running, pool=pool)


def sjf_easy(
    *,
    now: float,
    nodes: Sequence[NodeView],
    running: Sequence[RunningView],
    pending: Sequence[PendingJob],
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    config: PolicyConfig = DEFAULT_CONFIG,
    memo: ReleaseMemo | None = None,
) -> Plan:
    """EASY backfilling with the queue ordered by estimate, shortest first."""
    pool = _FlatPool(nodes)
    return _easy(_queue(pending, now=now, pool=pool, key=_by_estimate), now=now, running=running, pool=pool)
