"""The scheduling policy: which queued jobs get GPUs now, where, and when the rest can expect to.

Pure core: standard library only, no clock (``now`` is POSIX seconds passed in), no I/O. The same
``plan()`` runs in the live scheduler pass and in trace replay (``jobs.scheduling.simulate``).

The default policy, in order of precedence:

1. **Starvation bound** - a job queued longer than ``starvation_s`` goes to the front (oldest first)
   and holds a reservation whatever its team's fair share or its size.
2. **Priority** - ``fairshare_weight * F + age_weight * days_waited + size_weight * S`` where
   ``F = 2 ** -(usage_share / share)`` (usage decayed with ``half_life_s``, both normalised over the
   teams with queued or running jobs) and ``S = 1 / (1 + log2(1 + declared GPU-hours))`` favours
   small, short requests. Age grows without limit, so no job is overtaken by newer ones forever.
3. **Reservations and backfill** - the top ``reserve_top`` blocked jobs (and every starved job)
   get a reservation: the earliest time their GPUs are free by declared hours, on named nodes.
   Any other job may start now only if it ends (by declared hours) before the earliest
   reservation, or uses GPUs no reservation counts on.
4. **Placement** - a job that fits one node stays on one node, best-fit (fewest free GPUs left);
   nodes caching the job's datasets first. Larger jobs take whole free nodes of the largest size,
   plus a best-fit node for any remainder.
5. **Elastic and backlog jobs** - an elastic job that cannot start at full size starts now with as
   many GPUs as one placement gives (at least ``min_gpus``). Preemptible ("backlog") jobs are
   placed after every other job, on any idle GPU, and count as free when reservations are made: a
   reservation that could start now on their GPUs preempts them (ids in ``Plan.preemptions``).

Invariants of every ``Plan``: starts use only GPUs free now on schedulable nodes, none twice; a
backfilled start never delays a reservation (judged by declared hours); every pending job has an
estimate, with ``start_at`` None only when the pool can never place it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

HOUR_S = 3600.0
DAY_S = 86400.0
INF = math.inf


# --------------------------------------------------------------------------- interface


@dataclass(frozen=True, slots=True)
class NodeView:
    """One GPU node as the scheduler sees it now."""

    name: str
    gpus: int
    free: tuple[int, ...]
    schedulable: bool = True
    cached_datasets: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class RunningView:
    """A job holding GPUs now; ``expected_end`` is rent time + declared hours."""

    job_id: int
    team: str
    gpus_by_node: dict[str, tuple[int, ...]]
    started_at: float
    expected_end: float
    preemptible: bool = False


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A queued (or still staging) job; ``hours`` is the declared limit used for backfill."""

    job_id: int
    team: str
    gpus: int
    hours: float
    submitted_at: float
    min_gpus: int | None = None
    preemptible: bool = False
    ready_at: float | None = None
    datasets: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Knobs of the default policy (see the module docstring for how they combine).

    ``fairshare_weight`` scales F in (0, 1]; ``age_weight`` is priority per day waited, so with the
    defaults one day of waiting outweighs any fair-share or size difference; ``size_weight`` scales
    S in (0, 1]. ``max_reservations`` caps reservations per pass (starved jobs beyond it get theirs
    once those ahead start). ``explain=False`` skips estimates, reasons and the priority breakdown
    (the simulator's setting); starts, preemptions and reservations are the same either way.
    """

    half_life_s: float = 7 * DAY_S
    fairshare_weight: float = 1.0
    age_weight: float = 1.0
    size_weight: float = 1.0
    starvation_s: float = 1 * DAY_S
    reserve_top: int = 1
    max_reservations: int = 32
    explain: bool = True


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


def decay_usage(*, usage: float, elapsed_s: float, half_life_s: float) -> float:
    """Usage ``elapsed_s`` later: it halves every ``half_life_s``; never negative elapsed."""
    return usage * 2.0 ** (-max(elapsed_s, 0.0) / half_life_s)


# --------------------------------------------------------------------------- priority


def fairshare_factors(
    *, teams: Iterable[str], usage: Mapping[str, float], shares: Mapping[str, float]
) -> dict[str, float]:
    """F per team in (0, 1]: 1 with no usage, 0.5 when usage fraction equals share fraction.

    Both fractions are over ``teams`` (those present); a missing share counts as 1.0.
    """
    teams = list(teams)
    share = {t: max(float(shares.get(t, 1.0)), 1e-9) for t in teams}
    used = {t: max(float(usage.get(t, 0.0)), 0.0) for t in teams}
    total_share, total_used = sum(share.values()), sum(used.values())
    if total_used <= 0.0:
        return dict.fromkeys(teams, 1.0)
    return {t: 2.0 ** -((used[t] / total_used) / (share[t] / total_share)) for t in teams}


def size_factor(*, gpus: int, hours: float) -> float:
    """S in (0, 1]: 1 for a tiny request, halving roughly per doubling of declared GPU-hours."""
    return 1.0 / (1.0 + math.log2(1.0 + gpus * max(hours, 0.0)))


@dataclass(frozen=True, slots=True)
class _Ranking:
    order: list[PendingJob]
    starved: frozenset[int]
    fairshare: dict[str, float]
    components: Callable[[], dict[int, dict[str, float]]]


def _rank(
    *,
    now: float,
    pending: Sequence[PendingJob],
    running: Sequence[RunningView],
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    config: PolicyConfig,
) -> _Ranking:
    """Priority order: starved jobs first (oldest first), then by total priority, then age, id."""
    teams = {j.team for j in pending}
    teams.update(r.team for r in running)
    fs = fairshare_factors(teams=teams, usage=usage, shares=shares)
    fs_w, age_w, size_w = config.fairshare_weight, config.age_weight, config.size_weight
    age_per_s = age_w / DAY_S
    starve_before = now - config.starvation_s
    keyed = []
    for j in pending:
        total = (
            fs_w * fs[j.team]
            + age_per_s * (now - j.submitted_at)
            + size_w * size_factor(gpus=j.gpus, hours=j.hours)
        )
        starved = j.submitted_at < starve_before
        # Starved jobs sort among themselves by submit time so the bound is first-come-first-served.
        keyed.append(((not starved, j.submitted_at if starved else -total, j.submitted_at, j.job_id), j))
    keyed.sort(key=_first)
    order = [j for _, j in keyed]
    starved_ids = frozenset(j.job_id for key, j in keyed if not key[0])

    def components() -> dict[int, dict[str, float]]:
        return {
            j.job_id: _components(j, now=now, fs=fs[j.team], config=config, starved=j.job_id in starved_ids)
            for j in order
        }

    return _Ranking(order=order, starved=starved_ids, fairshare=fs, components=components)


def _first(pair: tuple) -> object:
    return pair[0]


def _components(
    job: PendingJob, *, now: float, fs: float, config: PolicyConfig, starved: bool
) -> dict[str, float]:
    fairshare = config.fairshare_weight * fs
    age = config.age_weight * max(now - job.submitted_at, 0.0) / DAY_S
    size = config.size_weight * size_factor(gpus=job.gpus, hours=job.hours)
    return {
        "fairshare": fairshare,
        "age": age,
        "size": size,
        "total": fairshare + age + size,
        "starved": 1.0 if starved else 0.0,
    }


# --------------------------------------------------------------------------- free-GPU index


class _FreeIndex:
    """Nodes bucketed by how many GPUs a class of job may use on them now (best-fit in O(node size)).

    Buckets are dicts used as ordered sets so that choices are deterministic across runs.
    """

    __slots__ = ("buckets", "count", "top")

    def __init__(self, max_gpus: int) -> None:
        self.count: dict[str, int] = {}
        self.buckets: list[dict[str, None]] = [{} for _ in range(max_gpus + 1)]
        self.top = 0  # largest non-empty bucket

    def set(self, node: str, k: int) -> None:
        old = self.count.get(node, 0)
        if old == k:
            return
        if old > 0:
            del self.buckets[old][node]
        if k > 0:
            self.buckets[k][node] = None
            self.count[node] = k
            self.top = max(self.top, k)
        else:
            self.count.pop(node, None)
        while self.top > 0 and not self.buckets[self.top]:
            self.top -= 1

    def get(self, node: str) -> int:
        return self.count.get(node, 0)

    def best_fit(self, g: int, *, exclude: Mapping[str, object] | None = None) -> str | None:
        """The node with the fewest usable GPUs that still holds ``g`` (first-come on ties)."""
        for k in range(g, self.top + 1):
            for node in self.buckets[k]:
                if exclude is None or node not in exclude:
                    return node
        return None


# --------------------------------------------------------------------------- one pass


@dataclass(slots=True)
class _Held:
    """A reservation being built: the job, its time, GPUs needed per node."""

    job: PendingJob
    start_at: float
    need: dict[str, int]


class _Pass:
    """Working state of one scheduling pass. Never escapes ``schedule()``.

    Views of free GPUs now: ``short`` - every idle GPU (for jobs that end, by declared hours,
    before the earliest reservation); ``long`` - idle GPUs no reservation counts on (for jobs that
    run past one). GPUs of preemptible running jobs ("soft") are in neither view: only a
    reservation may take them, by preempting.
    """

    def __init__(self, *, now: float, nodes: Sequence[NodeView], running: Sequence[RunningView]) -> None:
        self.now = now
        self.capacity: dict[str, int] = {}
        self.free: dict[str, list[int]] = {}
        self.cache_nodes: dict[str, list[str]] = {}
        for n in nodes:
            if n.schedulable:
                self.capacity[n.name] = n.gpus
                if n.free:
                    self.free[n.name] = list(n.free)
                for key in n.cached_datasets:
                    self.cache_nodes.setdefault(key, []).append(n.name)
        self.node_gpus = max(self.capacity.values(), default=0)
        self.big_nodes = sum(1 for g in self.capacity.values() if g == self.node_gpus)
        self.second_gpus = max((g for g in self.capacity.values() if g < self.node_gpus), default=0)
        self.total_gpus = sum(self.capacity.values())
        self.short = _FreeIndex(self.node_gpus)
        self.long = _FreeIndex(self.node_gpus)
        for name, idx in self.free.items():
            self.short.set(name, len(idx))
            self.long.set(name, len(idx))
        self.running = running
        self.soft: dict[str, int] = {}
        self.soft_jobs: dict[str, list[RunningView]] = {}
        for r in running:
            if r.preemptible:
                for name, idx in r.gpus_by_node.items():
                    if name in self.capacity:
                        self.soft[name] = self.soft.get(name, 0) + len(idx)
                        self.soft_jobs.setdefault(name, []).append(r)
        self.reserved_hard: dict[str, int] = {}
        self.reserved_soft: dict[str, int] = {}
        self.debt: dict[str, int] = {}
        self.first_reservation = INF
        self.held: list[_Held] = []
        self.local_events: list[tuple[float, dict[str, int]]] = []  # ends of this pass's starts/holds
        self.starts: list[Start] = []
        self.started_gpus: dict[int, int] = {}
        self.preempted: dict[int, None] = {}
        self.preempt_spare: dict[str, list[int]] = {}  # GPUs of preempted jobs no hold claimed yet
        self.preempt_ready: dict[int, dict[str, tuple[int, ...]]] = {}
        self._releases: list[RunningView] | None = None
        self._by_node: dict[str, list[RunningView]] | None = None

    # ----- feasibility

    def ever_fits(self, g: int) -> bool:
        """Whether the schedulable pool could hold ``g`` GPUs under the placement rules."""
        if g <= self.node_gpus:
            return g > 0
        whole, rest = divmod(g, self.node_gpus)
        if self.big_nodes < whole:
            return False
        return rest == 0 or self.big_nodes > whole or self.second_gpus >= rest

    # ----- placement now

    def place(self, job: PendingJob, g: int, *, view: _FreeIndex) -> dict[str, int] | None:
        """Counts per node for ``g`` GPUs in ``view``, or None when they do not fit now."""
        if g <= self.node_gpus:
            node = self._local_fit(job, g, view) or view.best_fit(g)
            return None if node is None else {node: g}
        whole, rest = divmod(g, self.node_gpus)
        full = view.buckets[self.node_gpus]
        if len(full) < whole:
            return None
        chosen: dict[str, int] = {}
        for node in full:
            if len(chosen) == whole:
                break
            chosen[node] = self.node_gpus
        if rest:
            node = view.best_fit(rest, exclude=chosen)
            if node is None:
                return None
            chosen[node] = rest
        return chosen

    def _local_fit(self, job: PendingJob, g: int, view: _FreeIndex) -> str | None:
        """Best-fit among nodes that already cache one of the job's datasets (no transfer)."""
        if not job.datasets or not self.cache_nodes:
            return None
        best, best_k = None, INF
        for key in job.datasets:
            for node in self.cache_nodes.get(key, ()):
                k = view.get(node)
                if g <= k < best_k:
                    best, best_k = node, k
        return best

    def view_for(self, end: float) -> _FreeIndex:
        """Jobs ending by the earliest reservation may use any idle GPU; others only unreserved ones."""
        return self.short if end <= self.first_reservation else self.long

    def take(self, job: PendingJob, counts: Mapping[str, int], *, end: float) -> dict[str, tuple[int, ...]]:
        """Claim idle GPUs for a start; a long job takes from the tail, away from reserved ones."""
        from_tail = end > self.first_reservation
        gpus_by_node = {}
        for node, k in counts.items():
            idx = self.free[node]
            if from_tail:
                taken, self.free[node] = idx[len(idx) - k :], idx[: len(idx) - k]
            else:
                taken, self.free[node] = idx[:k], idx[k:]
            gpus_by_node[node] = tuple(sorted(taken))
            self._sync(node)
        self.local_events.append((end, dict(counts)))
        return gpus_by_node

    def _sync(self, node: str) -> None:
        free = len(self.free.get(node, ()))
        self.short.set(node, free)
        self.long.set(node, max(0, free - self.reserved_hard.get(node, 0)))

    def start(self, job: PendingJob, counts: Mapping[str, int]) -> None:
        end = self.now + job.hours * HOUR_S
        self.starts.append(Start(job_id=job.job_id, gpus_by_node=self.take(job, counts, end=end)))
        self.started_gpus[job.job_id] = sum(counts.values())

    def try_start(self, job: PendingJob) -> bool:
        """Start ``job`` now at full size, else (elastic) at the largest size one placement gives."""
        end = self.now + job.hours * HOUR_S
        view = self.view_for(end)
        counts = self.place(job, job.gpus, view=view)
        if counts is None and job.min_gpus is not None and job.min_gpus < job.gpus:
            counts = self._elastic_counts(job, view)
        if counts is None:
            return False
        self.start(job, counts)
        return True

    def _elastic_counts(self, job: PendingJob, view: _FreeIndex) -> dict[str, int] | None:
        whole_gpus = len(view.buckets[self.node_gpus]) * self.node_gpus
        if job.gpus > self.node_gpus and whole_gpus > self.node_gpus:
            g = min(job.gpus, whole_gpus)
            g -= g % self.node_gpus
        else:
            g = min(job.gpus, view.top)
        if g < (job.min_gpus or job.gpus) or g <= 0:
            return None
        return self.place(job, g, view=view)

    # ----- reservations

    def releases(self) -> list[RunningView]:
        """Non-preemptible running jobs by expected end (preemptible ones count as free already)."""
        if self._releases is None:
            self._releases = sorted((r for r in self.running if not r.preemptible), key=_expected_end)
        return self._releases

    def reserve(self, job: PendingJob) -> _Held | None:
        """Earliest start of ``job`` by declared hours, without moving any earlier reservation."""
        found = _Walk(self, job.gpus).run()
        if found is None:
            return None
        start_at, need, gained = found
        hold = _Held(job=job, start_at=start_at, need=need)
        due_now = start_at <= self.now
        parts = {
            node: self._capture(node, k, from_releases=min(k, gained.get(node, 0)), idle_first=due_now)
            for node, k in need.items()
        }
        self.held.append(hold)
        self.first_reservation = min(self.first_reservation, start_at)
        self.local_events.append((start_at + job.hours * HOUR_S, dict(need)))
        if due_now and any(soft for _, soft in parts.values()):
            self._preempt_for(hold, parts)
        return hold

    def _capture(self, node: str, k: int, *, from_releases: int, idle_first: bool) -> tuple[int, int]:
        """Count ``k`` GPUs of ``node`` for a hold: releases first, then backlog and idle GPUs.

        A future hold counts on backlog (soft) GPUs before idle ones, leaving idle GPUs to
        backfill; a hold due now takes idle GPUs first so that it preempts as little as possible.
        Returns (idle, soft) GPUs counted.
        """
        self.debt[node] = self.debt.get(node, 0) + from_releases
        now_part = k - from_releases
        soft_left = max(self.soft.get(node, 0) - self.reserved_soft.get(node, 0), 0)
        idle_left = max(len(self.free.get(node, ())) - self.reserved_hard.get(node, 0), 0)
        if idle_first:
            hard_part = min(now_part, idle_left)
            soft_part = now_part - hard_part
        else:
            soft_part = min(now_part, soft_left)
            hard_part = now_part - soft_part
        self.reserved_soft[node] = self.reserved_soft.get(node, 0) + soft_part
        self.reserved_hard[node] = self.reserved_hard.get(node, 0) + hard_part
        self._sync(node)
        return hard_part, soft_part

    def _preempt_for(self, hold: _Held, parts: Mapping[str, tuple[int, int]]) -> None:
        """A hold due now on backlog GPUs: its idle GPUs, plus the fewest backlog jobs preempted."""
        ready: dict[str, tuple[int, ...]] = {}
        for node, (idle_k, soft_k) in parts.items():
            idle = self.free.get(node, [])
            # Unreserved idle GPUs sit at the tail (reserved ones are counted from the front).
            use, self.free[node] = idle[len(idle) - idle_k :], idle[: len(idle) - idle_k]
            self.reserved_hard[node] -= idle_k
            self._sync(node)
            spare = self.preempt_spare.setdefault(node, [])
            backlog = sorted(self.soft_jobs.get(node, ()), key=lambda r: -len(r.gpus_by_node[node]))
            for r in backlog:
                if len(spare) >= soft_k:
                    break
                if r.job_id not in self.preempted:
                    self.preempted[r.job_id] = None
                    spare.extend(r.gpus_by_node[node])
            use, self.preempt_spare[node] = use + spare[:soft_k], spare[soft_k:]
            ready[node] = tuple(sorted(use))
        self.preempt_ready[hold.job.job_id] = ready

    def reservation_gpus(self, hold: _Held) -> dict[str, tuple[int, ...]]:
        """Which GPU indices the hold expects on each node: released ones first, then idle ones."""
        if hold.job.job_id in self.preempt_ready:
            return self.preempt_ready[hold.job.job_id]
        if self._by_node is None:
            self._by_node = {}
            for r in self.releases():
                for node in r.gpus_by_node:
                    self._by_node.setdefault(node, []).append(r)
        out = {}
        for node, k in hold.need.items():
            ending = [
                i
                for r in self._by_node.get(node, ())
                if r.expected_end <= hold.start_at
                for i in r.gpus_by_node[node]
            ]
            out[node] = tuple(sorted((ending + self.free.get(node, []))[:k]))
        return out


def _expected_end(r: RunningView) -> float:
    return r.expected_end


class _Walk:
    """Walks releases in time order until ``g`` GPUs fit, net of what earlier holds captured.

    Availability per node starts at idle + soft - captured-now, and grows with each release
    (after paying off GPUs earlier holds expect from releases) and with each earlier hold's end.
    Holds are treated as occupying their GPUs from now to their end: conservative, never a clash.
    """

    def __init__(self, p: _Pass, g: int) -> None:
        self.p, self.g = p, g
        self.avail: dict[str, int] = dict(p.short.count)
        for node, k in p.soft.items():
            self.avail[node] = self.avail.get(node, 0) + k
        for held in (p.reserved_hard, p.reserved_soft):
            for node, k in held.items():
                self.avail[node] = self.avail.get(node, 0) - k
        self.debt = dict(p.debt)
        self.gained: dict[str, int] = {}
        self.multi = g > p.node_gpus
        self.whole, self.rest = divmod(g, p.node_gpus) if self.multi else (0, 0)
        self.whole_nodes: dict[str, None] = {}
        self.rest_nodes: dict[str, None] = {}
        self.found: dict[str, int] | None = None
        if self.multi:
            for node, k in self.avail.items():
                self._check(node, -INF, k)
        else:
            self._fit_now()

    def _fit_now(self) -> None:
        """Single-node job that fits at once (on backlog GPUs): the best fit, fewest preempted."""
        cap, soft, g = self.p.capacity, self.p.soft, self.g
        fits = [(k, soft.get(n, 0), n) for n, k in self.avail.items() if k >= g and cap.get(n, 0) >= g]
        if fits:
            self.found = {min(fits)[2]: g}

    def run(self) -> tuple[float, dict[str, int], dict[str, int]] | None:
        now = self.p.now
        if self.found is not None:
            return now, self.found, self.gained
        local = sorted(self.p.local_events, key=_first)
        li = 0
        for r in self.p.releases():
            t = r.expected_end
            while li < len(local) and local[li][0] <= t:
                if self._apply(local[li][1]):
                    return max(local[li][0], now), self.found, self.gained
                li += 1
            if self._apply(r.gpus_by_node, running=True):
                return max(t, now), self.found, self.gained
        for t, counts in local[li:]:
            if self._apply(counts):
                return max(t, now), self.found, self.gained
        return None

    def _apply(self, counts: Mapping[str, Sequence[int] | int], *, running: bool = False) -> bool:
        capacity = self.p.capacity
        for node, v in counts.items():
            if node not in capacity:
                continue
            k = len(v) if running else v
            owed = self.debt.get(node, 0)
            if owed:
                paid = min(owed, k)
                self.debt[node] = owed - paid
                k -= paid
            if k <= 0:
                continue
            old = self.avail.get(node, 0)
            self.avail[node] = old + k
            self.gained[node] = self.gained.get(node, 0) + k
            if self._check(node, old, old + k):
                return True
        return False

    def _check(self, node: str, old: float, new: int) -> bool:
        """Record threshold crossings of ``node``; True once the job fits somewhere."""
        cap = self.p.capacity.get(node, 0)
        if not self.multi:
            if old < self.g <= new and cap >= self.g and self.found is None:
                self.found = {node: self.g}
            return self.found is not None
        if cap == self.p.node_gpus and old < cap <= new:
            self.whole_nodes[node] = None
        if self.rest and old < self.rest <= new:
            self.rest_nodes[node] = None
        return self._multi_fits()

    def _multi_fits(self) -> bool:
        if len(self.whole_nodes) < self.whole:
            return False
        chosen = dict.fromkeys(list(self.whole_nodes)[: self.whole], self.p.node_gpus)
        if self.rest:
            extra = next((n for n in self.rest_nodes if n not in chosen), None)
            if extra is None:
                return False
            chosen[extra] = self.rest
        self.found = chosen
        return True


# --------------------------------------------------------------------------- the pass


@dataclass(frozen=True, slots=True)
class _Outcome:
    started: dict[int, int]  # job id -> GPUs
    held: dict[int, _Held]
    never: set[int]
    blocked: list[PendingJob]  # in priority order: neither started, held, nor impossible


def schedule(
    *,
    now: float,
    nodes: Sequence[NodeView],
    running: Sequence[RunningView],
    order: Sequence[PendingJob],
    config: PolicyConfig,
    starved: frozenset[int] = frozenset(),
    backfill: bool = True,
    explainer: _Explainer | None = None,
) -> Plan:
    """Run one pass over ``order`` (highest priority first); the engine under every policy.

    ``backfill=False`` is strict first-come-first-served: stop at the first job that cannot start.
    """
    p = _Pass(now=now, nodes=nodes, running=running)
    outcome = _place_all(p, order, config=config, starved=starved, backfill=backfill)
    reservations = [
        Reservation(
            job_id=h.job.job_id,
            start_at=h.start_at,
            gpus_by_node=p.reservation_gpus(h) if config.explain or h.start_at <= now else None,
        )
        for h in p.held
    ]
    estimates: dict[int, Estimate] = {}
    if config.explain:
        estimates = (explainer or _Explainer()).estimates(p, order, outcome)
    return Plan(
        starts=p.starts,
        preemptions=list(p.preempted),
        reservations=reservations,
        estimates=estimates,
        priority={},
    )


def _place_all(
    p: _Pass, order: Sequence[PendingJob], *, config: PolicyConfig, starved: frozenset[int], backfill: bool
) -> _Outcome:
    """Non-preemptible jobs in priority order, then backlog jobs on whatever is still idle."""
    held: dict[int, _Held] = {}
    never: set[int] = set()
    blocked: list[PendingJob] = []
    backlog: list[PendingJob] = []
    top_holds = 0
    stopped = False
    for job in order:
        if not p.ever_fits(job.min_gpus or job.gpus):
            never.add(job.job_id)
            continue
        if stopped or (job.ready_at is not None and job.ready_at > p.now):
            blocked.append(job)
            continue
        if job.preemptible:
            backlog.append(job)
            continue
        if p.short.top and p.try_start(job):
            continue
        is_starved = job.job_id in starved
        wants_hold = is_starved or top_holds < config.reserve_top
        if wants_hold and len(held) < config.max_reservations:
            hold = p.reserve(job)
            if hold is not None:
                held[job.job_id] = hold
                top_holds += not is_starved
                continue
        blocked.append(job)
        # Strict FCFS stops at the first blocked job; otherwise stop scanning once nothing is
        # idle and no more reservations are due (the rest only need estimates).
        stopped = not backfill or (p.short.top == 0 and top_holds >= config.reserve_top and not is_starved)
    for job in backlog:
        if not p.try_start(job):
            blocked.append(job)
    return _Outcome(started=dict(p.started_gpus), held=held, never=never, blocked=blocked)


def plan(
    *,
    now: float,
    nodes: Sequence[NodeView],
    running: Sequence[RunningView],
    pending: Sequence[PendingJob],
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    config: PolicyConfig = PolicyConfig(),
) -> Plan:
    """One pass of the default policy (module docstring): starts, preemptions, reservations, estimates."""
    ranking = _rank(now=now, pending=pending, running=running, usage=usage, shares=shares, config=config)
    explainer = None
    if config.explain:
        explainer = _FairshareExplainer(ranking=ranking, usage=usage, shares=shares, config=config)
    result = schedule(
        now=now,
        nodes=nodes,
        running=running,
        order=ranking.order,
        config=config,
        starved=ranking.starved,
        explainer=explainer,
    )
    if not config.explain:
        return result
    return Plan(
        starts=result.starts,
        preemptions=result.preemptions,
        reservations=result.reservations,
        estimates=result.estimates,
        priority=ranking.components(),
    )


# --------------------------------------------------------------------------- estimates and reasons


def format_utc(ts: float, *, now: float | None = None) -> str:
    """``14:20 UTC``, with the day added when it is not the same UTC day as ``now``."""
    when = datetime.fromtimestamp(ts, UTC)
    if now is not None and when.date() != datetime.fromtimestamp(now, UTC).date():
        return f"{when:%H:%M} UTC on {when.day} {when:%b}"
    return f"{when:%H:%M} UTC"


def _describe_size(g: int, node_gpus: int) -> str:
    if g <= node_gpus:
        return f"needs {g} GPU{'s' if g != 1 else ''} on one node"
    whole, rest = divmod(g, node_gpus)
    extra = f" plus {rest} on another" if rest else ""
    return f"needs {g} GPUs: {whole} whole nodes{extra}"


class _Profile:
    """Idle GPUs over time if nothing new starts: running ends, this pass's starts, held GPUs.

    Used only for estimates: a blocked job is expected to start once the pool has worked through
    the GPU-seconds queued ahead of it and enough GPUs are idle at once.
    """

    def __init__(self, p: _Pass) -> None:
        now = p.now
        deltas: list[tuple[float, int]] = []
        busy = 0
        for r in p.releases():
            k = sum(len(v) for n, v in r.gpus_by_node.items() if n in p.capacity)
            busy += k
            deltas.append((max(r.expected_end, now), k))
        for end, counts in p.local_events:  # this pass's starts and holds: busy from now to their end
            k = sum(counts.values())
            busy += k
            deltas.append((max(end, now), k))
        deltas.sort(key=_first)
        self.times = [now]
        self.free = [max(p.total_gpus - busy, 0)]
        level = p.total_gpus - busy
        for t, k in deltas:
            level += k
            if t > self.times[-1]:
                self.times.append(t)
                self.free.append(max(level, 0))
            else:
                self.free[-1] = max(level, 0)
        self.area = [0.0]
        for i in range(1, len(self.times)):
            self.area.append(self.area[-1] + self.free[i - 1] * (self.times[i] - self.times[i - 1]))
        self.peak = []
        best = 0
        for f in self.free:
            best = max(best, f)
            self.peak.append(best)

    def when_done(self, work: float) -> float:
        """Time by which ``work`` GPU-seconds of idle capacity have passed."""
        area, times = self.area, self.times
        lo, hi = 0, len(area)
        while lo < hi:
            mid = (lo + hi) // 2
            if area[mid] <= work:
                lo = mid + 1
            else:
                hi = mid
        i = max(lo - 1, 0)
        rate = self.free[i]
        if rate <= 0:
            return times[min(i + 1, len(times) - 1)]
        return times[i] + (work - area[i]) / rate

    def when_idle(self, g: int) -> float:
        """First time ``g`` GPUs are idle together (pool-wide, ignoring node boundaries)."""
        lo, hi = 0, len(self.peak)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.peak[mid] >= g:
                hi = mid
            else:
                lo = mid + 1
        return self.times[min(lo, len(self.times) - 1)]


class _Explainer:
    """Estimates and reasons for a pass; subclassed by the default policy to name fair share."""

    def estimates(self, p: _Pass, order: Sequence[PendingJob], outcome: _Outcome) -> dict[int, Estimate]:
        out: dict[int, Estimate] = {}
        profile: _Profile | None = None
        work_ahead = 0.0
        head: PendingJob | None = None
        for job in order:
            jid = job.job_id
            if jid in outcome.never:
                out[jid] = self._never(p, job)
            elif jid in outcome.started:
                out[jid] = self._started(p, job, outcome.started[jid])
            elif jid in outcome.held:
                head = head or job
                out[jid] = self._held(p, outcome.held[jid])
            else:
                profile = profile or _Profile(p)
                out[jid] = self._blocked(p, job, profile, work_ahead, head)
                head = head or job
                work_ahead += job.gpus * job.hours * HOUR_S
        return out

    def _never(self, p: _Pass, job: PendingJob) -> Estimate:
        g = job.min_gpus or job.gpus
        reason = (
            f"larger than the pool can ever place: needs {g} GPUs, the schedulable pool has "
            f"{p.total_gpus} on {len(p.capacity)} nodes of up to {p.node_gpus} GPUs"
        )
        return Estimate(job.job_id, None, "too_large", reason)

    def _started(self, p: _Pass, job: PendingJob, got: int) -> Estimate:
        if got < job.gpus:
            reason = (
                f"starting now with {got} of {job.gpus} GPUs (elastic, at least {job.min_gpus}), "
                "sooner than waiting for all of them"
            )
            return Estimate(job.job_id, p.now, "starting_smaller", reason)
        return Estimate(job.job_id, p.now, "starting", "starting now")

    def _held(self, p: _Pass, hold: _Held) -> Estimate:
        job = hold.job
        where = _node_list(hold.need)
        if hold.start_at <= p.now and job.job_id in p.preempt_ready:
            reason = (
                f"{_describe_size(job.gpus, p.node_gpus)}; starting on {where} as soon as the "
                "backlog jobs there are preempted and requeued"
            )
            return Estimate(job.job_id, p.now, "preempting", reason)
        starved = ""
        if self.is_starved(job):
            starved = "waited past the starvation bound, so it holds a reservation: "
        reason = (
            f"{starved}{_describe_size(job.gpus, p.node_gpus)}; reserved on {where} "
            f"from {format_utc(hold.start_at, now=p.now)}"
        )
        return Estimate(job.job_id, hold.start_at, "reserved", reason)

    def is_starved(self, job: PendingJob) -> bool:
        return False

    def _blocked(
        self, p: _Pass, job: PendingJob, profile: _Profile, work_ahead: float, head: PendingJob | None
    ) -> Estimate:
        at = max(profile.when_done(work_ahead), profile.when_idle(job.min_gpus or job.gpus), p.now)
        if job.ready_at is not None and job.ready_at > p.now:
            at = max(at, job.ready_at)
            reason = (
                f"waiting for its data to finish staging (ETA {format_utc(job.ready_at, now=p.now)}); "
                f"expected to start about {format_utc(at, now=p.now)}"
            )
            return Estimate(job.job_id, at, "staging", reason)
        when = f"expected to start about {format_utc(at, now=p.now)}"
        if job.preemptible:
            reason = f"backlog job: runs on GPUs nobody else can use; {when}"
            return Estimate(job.job_id, at, "backlog", reason)
        size = _describe_size(job.gpus, p.node_gpus)
        if head is None:
            return Estimate(job.job_id, at, "no_gpus", f"{size}; not enough idle GPUs yet; {when}")
        behind = self.behind(job, head)
        if behind:
            return Estimate(job.job_id, at, "fairshare", f"{behind}; {size}; {when}")
        reason = f"{size}; waiting behind higher-priority job {head.job_id} ({head.gpus} GPUs); {when}"
        return Estimate(job.job_id, at, "queued", reason)

    def behind(self, job: PendingJob, head: PendingJob) -> str:
        return ""


def _node_list(need: Mapping[str, int]) -> str:
    names = list(need)
    if len(names) <= 3:
        return ", ".join(names)
    return f"{len(names)} nodes ({names[0]} ... {names[-1]})"


class _FairshareExplainer(_Explainer):
    """Names the team ahead and the fair-share numbers when that is why a job waits."""

    def __init__(
        self,
        *,
        ranking: _Ranking,
        usage: Mapping[str, float],
        shares: Mapping[str, float],
        config: PolicyConfig,
    ) -> None:
        self.ranking, self.usage, self.config = ranking, usage, config
        teams = list(ranking.fairshare)
        total_share = sum(max(float(shares.get(t, 1.0)), 1e-9) for t in teams) or 1.0
        self.share_pct = {t: 100.0 * max(float(shares.get(t, 1.0)), 1e-9) / total_share for t in teams}

    def is_starved(self, job: PendingJob) -> bool:
        return job.job_id in self.ranking.starved

    def behind(self, job: PendingJob, head: PendingJob) -> str:
        fs = self.ranking.fairshare
        if head.team == job.team or fs.get(head.team, 0.0) <= fs.get(job.team, 0.0):
            return ""
        used_h = float(self.usage.get(job.team, 0.0)) / HOUR_S
        days = self.config.half_life_s / DAY_S
        return (
            f"behind team {head.team} (your team used {used_h:,.0f} GPU-h, decayed with a "
            f"{days:g}-day half-life, against a {self.share_pct.get(job.team, 0.0):.0f}% share)"
        )
