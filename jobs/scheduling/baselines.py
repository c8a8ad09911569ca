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

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import compress, count, islice, repeat
from operator import and_, attrgetter, itemgetter, le, or_

from jobs.scheduling.types import (
    DEFAULT_CONFIG,
    HOUR_S,
    NodeList,
    NodeView,
    PendingJob,
    PendingList,
    Plan,
    PolicyConfig,
    ReleaseMemo,
    Reservation,
    RunningList,
    RunningView,
    Start,
    by_expected_end,
    by_submit,
    smallest_request,
)

_by_estimate = attrgetter("hours", "submitted_at", "job_id")
_expected_end = attrgetter("expected_end")
_gpus = attrgetter("gpus")
_hours = attrgetter("hours")
_held = itemgetter(2)  # of a release event (end, node, GPUs)


_free = attrgetter("free")
_schedulable = attrgetter("schedulable")
_ready_at = attrgetter("ready_at")


class _FlatPool:
    """The free GPUs of schedulable nodes as one count, handed out in node order."""

    def __init__(self, nodes: Sequence[NodeView]) -> None:
        self._left: tuple[int, ...] = ()
        if isinstance(nodes, NodeList):  # totals kept by the caller: no count over every node
            self.schedulable = None
            self.capacity, self.free = nodes.total_gpus, nodes.free_gpus
            self._nodes = ((nodes[i].name, nodes[i].free) for i in nodes.with_free)
            return
        # C-level maps: this runs every pass over every node.
        usable = nodes if all(map(_schedulable, nodes)) else [n for n in nodes if n.schedulable]
        self.schedulable = frozenset(n.name for n in usable) if len(usable) < len(nodes) else None
        self.capacity = sum(map(_gpus, usable))
        self.free = sum(map(len, map(_free, usable)))
        self._nodes: Iterator[tuple[str, tuple[int, ...]]] = ((n.name, n.free) for n in usable if n.free)

    def start(self, job: PendingJob) -> Start:
        """Take the job's GPUs from the next nodes with free ones."""
        need, taken = job.gpus, {}
        while need:
            if not self._left:
                self._name, self._left = next(self._nodes)
            k = min(need, len(self._left))
            taken[self._name], self._left = self._left[:k], self._left[k:]
            need -= k
        self.free -= job.gpus
        return Start(job_id=job.job_id, gpus_by_node=taken)

    def held_by(self, r: RunningView, memo: ReleaseMemo) -> int:
        """GPUs ``r`` holds on schedulable nodes (counted once per running view with ``memo``)."""
        hit = memo.get(r.job_id)
        if hit is None or hit[0] is not r:
            hit = (r, [(r.expected_end, n, len(ix)) for n, ix in r.gpus_by_node.items()])
            memo[r.job_id] = hit
        if self.schedulable is None:
            return sum(map(_held, hit[1]))  # C-level: a wide job spans many nodes
        return sum(k for _, n, k in hit[1] if n in self.schedulable)


def _queue(
    pending: Sequence[PendingJob],
    *,
    now: float,
    pool: _FlatPool,
    order: Callable[[Sequence[PendingJob]], Sequence[PendingJob]],
) -> Sequence[PendingJob]:
    """The jobs that can ever start, in the policy's order (staging ones are not queued yet)."""
    queue = order(pending)
    kept = isinstance(pending, PendingList) and pending.ready and pending.largest is not None
    if kept and pending.largest <= pool.capacity:
        return queue  # the keeper vouches for both: no scan of the whole queue
    if queue and (any(map(_ready_at, queue)) or max(map(_gpus, queue)) > pool.capacity):
        queue = [j for j in queue if j.gpus <= pool.capacity and (j.ready_at is None or j.ready_at <= now)]
    return queue


def _submit_order(pending: Sequence[PendingJob]) -> Sequence[PendingJob]:
    """``pending`` in submit order; the keeper's own list when it keeps that order (read, never changed)."""
    return pending if isinstance(pending, PendingList) and pending.by_submit else by_submit(pending)


def _shortest_first(pending: Sequence[PendingJob]) -> list[PendingJob]:
    if isinstance(pending, PendingList) and pending.by_submit:
        return sorted(pending, key=_hours)  # stable: ties keep submit order, as the full key orders them
    return sorted(pending, key=_by_estimate)


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
    for job in _queue(pending, now=now, pool=pool, order=_submit_order):
        if job.gpus > pool.free:
            break
        starts.append(pool.start(job))
    return _plan(starts, [])


def shadow_time(
    head: PendingJob, *, now: float, free: int, releases: Iterable[tuple[float, int]]
) -> tuple[float, int]:
    """EASY's reservation for ``head``: the earliest time enough GPUs are free, and the GPUs
    beyond its need free then (``releases``: (estimated end, GPUs) in end order)."""
    avail, at = free, now
    for end, gpus in releases:
        if avail >= head.gpus and end > at:
            break  # others ending at the shadow time itself were added: they are extra GPUs
        avail, at = avail + gpus, max(end, now)
    if avail < head.gpus:
        raise ValueError(f"job {head.job_id} needs {head.gpus} GPUs; the pool never frees them")
    return at, avail - head.gpus


def _releases(
    running: Sequence[RunningView], started: Sequence[tuple[float, int]], pool: _FlatPool, memo: ReleaseMemo
) -> Iterator[tuple[float, int]]:
    """(estimated end, GPUs on schedulable nodes) of running jobs and this pass's starts, by end;
    lazily, since the walk to the shadow time usually stops early."""
    ordered = by_expected_end(running)
    kept = running.held if isinstance(running, RunningList) and pool.schedulable is None else None
    if kept is not None:  # the keeper counted each job's GPUs; every node is schedulable, so all count
        releases: Iterator[tuple[float, int]] = zip(map(_expected_end, ordered), kept, strict=True)
    else:
        releases = ((r.expected_end, pool.held_by(r, memo)) for r in ordered)
    own = sorted(started)
    j = 0
    for end, gpus in releases:
        while j < len(own) and own[j][0] <= end:
            yield own[j]
            j += 1
        yield end, gpus
    yield from own[j:]


def _easy(
    queue: Sequence[PendingJob],
    *,
    now: float,
    running: Sequence[RunningView],
    pool: _FlatPool,
    smallest: int,
    memo: ReleaseMemo | None = None,
) -> Plan:
    """EASY over ``queue`` (already in the policy's order): one reservation, then backfill.
    ``smallest``: no queued job asks for fewer GPUs (backfill stops when fewer are free)."""
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
    shadow, extra = shadow_time(
        head, now=now, free=pool.free, releases=_releases(running, ends, pool, {} if memo is None else memo)
    )
    _backfill(rest, now=now, shadow=shadow, extra=extra, pool=pool, starts=starts, smallest=smallest)
    return _plan(starts, [Reservation(job_id=head.job_id, start_at=shadow, gpus_by_node=None)])


def _backfill(
    rest: Sequence[PendingJob],
    *,
    now: float,
    shadow: float,
    extra: int,
    pool: _FlatPool,
    starts: list[Start],
    smallest: int,
) -> None:
    """EASY's backfill over ``rest``, in order: a job starts if it fits the free GPUs and ends by the
    shadow time or fits the extra GPUs (which it then uses up).

    The tests run in C over the jobs not yet visited, and again from the next job after each start
    (what is free, and extra, only shrink), so Python visits only the jobs that start - not the
    hundreds that fitted before earlier starts took the GPUs - and each job is tested about once.
    With fewer GPUs free than ``smallest`` (no job asks for fewer) nothing can fit: no scan at all
    (about a third of the backfills on the first 40,000 RICC jobs, on its 1,024 x 8 machine).
    """
    window = (shadow - now) / HOUR_S + 1e-9  # the C test's margin; the exact test follows in Python
    k = 0
    while pool.free >= smallest and k < len(rest):
        candidates = fits = map(le, map(_gpus, islice(rest, k, None)), repeat(pool.free))
        if extra < pool.free:  # else whatever fits the free GPUs fits the extra ones
            by_shadow = map(le, map(_hours, islice(rest, k, None)), repeat(window))
            allowed = map(or_, by_shadow, map(le, map(_gpus, islice(rest, k, None)), repeat(extra)))
            candidates = map(and_, fits, allowed)
        for k in compress(count(k), candidates):  # noqa: B020 (k resumes after the loop)
            job = rest[k]
            past_shadow = now + job.hours * HOUR_S > shadow
            if past_shadow and job.gpus > extra:
                continue  # passed only by the margin: it would delay the head's reservation
            starts.append(pool.start(job))
            extra -= job.gpus if past_shadow else 0
            k += 1
            break
        else:
            return


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
    return _easy(
        _queue(pending, now=now, pool=pool, order=_submit_order),
        now=now,
        running=running,
        pool=pool,
        smallest=smallest_request(pending),
        memo=memo,
    )


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
    return _easy(
        _queue(pending, now=now, pool=pool, order=_shortest_first),
        now=now,
        running=running,
        pool=pool,
        smallest=smallest_request(pending),
        memo=memo,
    )
