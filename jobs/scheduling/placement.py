"""The engine under every engine-based policy: one pass over jobs in priority order.

It places starts (best fit on one node, or whole nodes plus a remainder), makes reservations by
walking the running jobs' releases forward, backfills what does not delay them, and preempts
backlog jobs a due reservation needs. Pure core: standard library only, ``now`` passed in.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from jobs.scheduling import explanation
from jobs.scheduling.types import (
    HOUR_S,
    Estimate,
    NodeView,
    PendingJob,
    Plan,
    PolicyConfig,
    ReleaseMemo,
    Reservation,
    RunningView,
    Start,
    any_preemptible,
    by_expected_end,
    part_share,
    serves,
)

INF = math.inf

_cached = attrgetter("cached_datasets")
_gpus = attrgetter("gpus")
_name = attrgetter("name")
_schedulable = attrgetter("schedulable")
_disk = attrgetter("disk")
_gpu_model = attrgetter("gpu_model")


def _offers(node: NodeView) -> bool:
    return bool(node.memory or node.cpus or node.disk) or node.free_disk is not None


def _first(pair: tuple) -> object:
    return pair[0]


# --------------------------------------------------------------------------- free-GPU index


class _FreeIndex:
    """Nodes bucketed by how many GPUs a class of job may use on them now (best-fit in O(node size)).

    Buckets are dicts used as ordered sets so that choices are deterministic across runs.
    """

    __slots__ = ("buckets", "count", "top")

    def __init__(self, max_gpus: int, count: dict[str, int] | None = None) -> None:
        self.count: dict[str, int] = count if count is not None else {}
        self.buckets: list[dict[str, None]] = [{} for _ in range(max_gpus + 1)]
        for node, k in self.count.items():
            self.buckets[k][node] = None
        self.top = max(self.count.values(), default=0)  # largest non-empty bucket

    def copy(self) -> _FreeIndex:
        twin = _FreeIndex.__new__(_FreeIndex)
        twin.count, twin.top = dict(self.count), self.top
        twin.buckets = [dict(b) for b in self.buckets]
        return twin

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

    def best_fit(
        self,
        g: int,
        *,
        exclude: Mapping[str, object] | None = None,
        accept: Callable[[str], bool] | None = None,
    ) -> str | None:
        """The node with the fewest usable GPUs that still holds ``g`` (first-come on ties), among
        those ``accept`` takes (nodes with the memory and CPUs the job needs there)."""
        for k in range(g, self.top + 1):
            for node in self.buckets[k]:
                if (exclude is None or node not in exclude) and (accept is None or accept(node)):
                    return node
        return None


class _Room:
    """Memory, CPUs and disk still free on the nodes that advertise them, as this pass places starts.

    A part needs ``part_share`` of memory and CPUs on its node: the job's declaration split by GPUs,
    or the node's share for the GPUs it takes there; and its whole attempt space on the node's disk.
    Nodes that advertise none of them (trace replays) constrain nothing, so GPU-only placement is
    unchanged there. The disk steers without holding back (``counting_disk``): a job held back for a
    disk would keep a reservation, which is by GPUs, on nodes whose disks may never hold it; so a job
    no disk has room for now is placed by the rest, and the agent's refusal of its space decides.
    Only a space larger than every disk taking work, each in all, is not placed (``Pass.ever_holds``).
    """

    __slots__ = ("counting_disk", "cpus", "disk", "memory", "nodes", "refused_for_disk")

    def __init__(self, nodes: Sequence[NodeView]) -> None:
        self.nodes = {n.name: n for n in nodes if _offers(n)}
        self.memory = {name: n.free_memory for name, n in self.nodes.items()}
        self.cpus = {name: n.free_cpus for name, n in self.nodes.items()}
        self.disk = {name: n.free_disk for name, n in self.nodes.items() if n.free_disk is not None}
        self.counting_disk = True
        self.refused_for_disk = False  # since the last placement began: whether trying without disk may help

    def need(self, job: PendingJob, node: str, k: int, total: int) -> tuple[float, float]:
        """``k`` of the ``total`` GPUs being placed: an elastic job started on fewer than it declared
        splits its declaration over the GPUs it gets, as the agent does."""
        n = self.nodes[node]
        shape = {"job_gpus": total, "node_gpus": n.gpus, "gpus_here": k}
        memory = part_share(declared=job.memory, node_total=n.memory, **shape) if n.memory else 0.0
        cpus = part_share(declared=job.cpus, node_total=n.cpus, **shape) if n.cpus else 0.0
        return memory, cpus

    def fits(self, job: PendingJob, node: str, k: int, total: int) -> bool:
        n = self.nodes.get(node)
        if n is None:
            return True
        if self.counting_disk and job.space > self.disk.get(node, INF):
            self.refused_for_disk = True
            return False
        return self._covers(job, node, k, total, memory=self.memory[node], cpus=self.cpus[node])

    def ever_fits(self, job: PendingJob, node: str, k: int, total: int) -> bool:
        """Whether the node, every other part gone, could give ``k`` of the job's ``total`` GPUs their memory and CPUs."""
        n = self.nodes.get(node)
        return n is None or self._covers(job, node, k, total, memory=n.memory, cpus=n.cpus)

    def _covers(self, job: PendingJob, node: str, k: int, total: int, *, memory: float, cpus: float) -> bool:
        """Whether ``memory`` and ``cpus`` on the node hold the part's share (what it does not offer, it does not limit)."""
        n = self.nodes[node]
        need_memory, need_cpus = self.need(job, node, k, total)
        return (not n.memory or need_memory <= memory * _SLACK) and (not n.cpus or need_cpus <= cpus * _SLACK)

    def take(self, job: PendingJob, node: str, k: int, total: int) -> None:
        if node in self.nodes:
            memory, cpus = self.need(job, node, k, total)
            self.memory[node] -= memory
            self.cpus[node] -= cpus
            if node in self.disk:
                self.disk[node] -= job.space


_SLACK = 1 + 1e-9  # shares are float arithmetic: a node's exact share must still fit


def _largest_disks(nodes: Sequence[NodeView]) -> tuple[float, float]:
    """What the largest disk holds in all: among the nodes taking work (unbounded while one of them does not say),
    and among every node that says (those draining, drained or held too)."""
    taking = [n.disk for n in nodes if n.schedulable]
    return (max(taking) if taking and all(taking) else INF), max(map(_disk, nodes), default=0)


# --------------------------------------------------------------------------- one pass


@dataclass(slots=True)
class Held:
    """A reservation being built: the job, its time, GPUs needed per node."""

    job: PendingJob
    start_at: float
    need: dict[str, int]
    from_releases: dict[str, int] = field(default_factory=dict)  # per node, GPUs running jobs free for it


@dataclass(frozen=True, slots=True)
class _Shape:
    """What the pass needs from the pool that only changes when nodes join, leave or drain."""

    capacity: dict[str, int]  # schedulable node -> GPUs (shared between passes: read-only)
    all_schedulable: bool
    node_gpus: int  # the largest node
    big_nodes: int  # how many nodes have that many GPUs
    second_gpus: int  # the largest smaller node, 0 if none
    total_gpus: int
    paused: tuple[int, int]  # (nodes, GPUs) not taking jobs for now (explanation.PAUSES): back once they do


_SHAPE_MEMO: list[tuple[tuple, _Shape]] = []


def _pool_shape(nodes: Sequence[NodeView]) -> _Shape:
    """The pool's shape, recomputed only when names, sizes or schedulability change (C-level check)."""
    key = (tuple(map(_name, nodes)), tuple(map(_gpus, nodes)), tuple(map(_schedulable, nodes)))
    if _SHAPE_MEMO and _SHAPE_MEMO[0][0] == key:
        return _SHAPE_MEMO[0][1]
    capacity = {n.name: n.gpus for n in nodes if n.schedulable}
    sizes = list(capacity.values())
    largest = max(sizes, default=0)
    big_nodes, second_gpus = _wide_shape(sizes, largest)
    shape = _Shape(
        capacity=capacity,
        all_schedulable=len(capacity) == len(nodes),
        node_gpus=largest,
        big_nodes=big_nodes,
        second_gpus=second_gpus,
        total_gpus=sum(sizes),
        paused=(len(nodes) - len(capacity), sum(n.gpus for n in nodes) - sum(sizes)),
    )
    _SHAPE_MEMO[:] = [(key, shape)]
    return shape


def _wide_shape(sizes: list[int], largest: int) -> tuple[int, int]:
    """What a job wider than one node is placed by: how many nodes have the ``largest`` size, and the largest
    size below it (0 if none)."""
    return sizes.count(largest), max((k for k in sizes if k < largest), default=0)


@dataclass(frozen=True, slots=True)
class _Kind:
    """The schedulable nodes of one GPU model a job asked for: the shape placement reads for such a job, under
    the same names as ``Pass`` has them for the whole pool (which is the shape of a job that names none)."""

    model: str  # as asked
    capacity: dict[str, int]
    span_capacity: dict[str, int]
    node_gpus: int
    big_nodes: int
    second_gpus: int
    total_gpus: int
    paused: tuple[int, int]  # (nodes, GPUs) of the model not taking jobs for now

    @staticmethod
    def of(p: Pass, model: str) -> _Kind:
        ours = {name for name, node_model in p.node_models.items() if serves(node_model, model)}
        capacity = {n: k for n, k in p.capacity.items() if n in ours}
        span = {n: k for n, k in capacity.items() if n not in p.no_span} if p.no_span else capacity
        largest = max(capacity.values(), default=0)
        big_nodes, second_gpus = _wide_shape(list(span.values()), largest)
        paused = [p.node_sizes[n] for n in ours if n not in capacity]
        return _Kind(
            model=model,
            capacity=capacity,
            span_capacity=span,
            node_gpus=largest,
            big_nodes=big_nodes,
            second_gpus=second_gpus,
            total_gpus=sum(capacity.values()),
            paused=(len(paused), sum(paused)),
        )


class PoolState:
    """What a pass reads from the pool's nodes: their shape, free GPUs in node order, and the
    free-GPU index (nodes bucketed by free GPUs, in node order within a bucket).

    The live scheduler builds one from its snapshot each pass (``of(nodes)``). The replay keeps
    one for the whole run (``types.NodeList.state``) and names the nodes whose views it replaced
    (``changed``); the state reads them when a pass next asks for it (``set_free``), so a pass
    copies it instead of visiting every node, and a policy that never asks costs nothing. Orders are node order
    either way - best fit takes the first node on ties - so both give the same decisions: a kept
    state notes which of its dicts went out of order and re-sorts only those, before a pass.
    """

    __slots__ = (
        "_dirty",
        "_nodes",
        "_pos",
        "_stale",
        "cache_nodes",
        "count",
        "free",
        "index",
        "no_span",
        "offers",
        "shape",
    )

    def __init__(self, nodes: Sequence[NodeView], *, kept: bool = False) -> None:
        """``kept``: a keeper will replace views in ``nodes`` and say which (``changed``), and hand
        this state to every pass."""
        self.shape = shape = _pool_shape(nodes)
        if shape.all_schedulable:
            self.free: dict[str, list[int]] = {n.name: list(n.free) for n in nodes if n.free}
        else:
            self.free = {n.name: list(n.free) for n in nodes if n.free and n.schedulable}
        self.no_span = {n.name: None for n in nodes if not n.spans}  # never given a part of a spanning job
        self.cache_nodes: dict[str, list[str]] = {}
        if any(map(_cached, nodes)):
            for n in nodes:
                if n.schedulable:
                    for key in n.cached_datasets:
                        self.cache_nodes.setdefault(key, []).append(n.name)
        self.offers = any(map(_offers, nodes))
        self.index = _FreeIndex(shape.node_gpus, {name: len(idx) for name, idx in self.free.items()})
        self.count = self.index.count
        self._pos = {n.name: i for i, n in enumerate(nodes)} if kept else {}
        self._dirty: set[int] = set()  # ids of dicts (free, count, a bucket) out of node order
        self._nodes = nodes if kept else ()
        self._stale: dict[str, None] = {}  # nodes whose views changed since the last pass

    @staticmethod
    def of(nodes: Sequence[NodeView]) -> PoolState:
        """The state a keeper maintains for ``nodes``, else one built from them now."""
        kept = getattr(nodes, "state", None)
        return kept.in_order() if kept is not None else PoolState(nodes)

    def changed(self, nodes: Iterable[str]) -> None:
        """The keeper replaced these nodes' views (in the list the state was built from)."""
        self._stale.update(dict.fromkeys(nodes))

    def set_free(self, node: str, free: list[int]) -> None:
        """A keeper's report: ``node`` now has ``free`` idle, in index order (a new list: passes
        share the lists and never change them)."""
        if free:
            self._note_order(self.free, node)
            self.free[node] = free
        else:
            self.free.pop(node, None)
        index, k = self.index, len(free)
        if k and index.count.get(node, 0) != k:  # it joins bucket k, and count if it was not there
            self._note_order(index.buckets[k], node)
            self._note_order(index.count, node)
        index.set(node, k)

    def _note_order(self, d: dict, node: str) -> None:
        """``node`` is about to be added to ``d``: note whether that breaks node order."""
        if node not in d and d and self._pos[next(reversed(d))] > self._pos[node]:
            self._dirty.add(id(d))

    def in_order(self) -> PoolState:
        """Itself, up to date with the views the keeper changed, every dict in node order."""
        for node in self._stale:
            self.set_free(node, list(self._nodes[self._pos[node]].free))
        self._stale.clear()
        if self._dirty:
            where = self._pos.__getitem__
            for d in (self.free, self.count, *self.index.buckets):
                if id(d) in self._dirty:
                    keys = sorted(d, key=where)
                    values = list(map(d.__getitem__, keys))
                    d.clear()
                    d.update(zip(keys, values, strict=True))
            self._dirty.clear()
        return self


class Pass:
    """Working state of one scheduling pass. Never escapes ``run()``, but read-only in its ``Afterwards``.

    Views of free GPUs now: ``short`` - every idle GPU (for jobs that end, by declared hours,
    before the earliest reservation); ``long`` - idle GPUs no reservation counts on (for jobs that
    run past one). GPUs of preemptible running jobs ("soft") are in neither view: only a
    reservation may take them, by preempting.
    """

    def __init__(
        self,
        *,
        now: float,
        nodes: Sequence[NodeView],
        running: Sequence[RunningView],
        memo: ReleaseMemo | None = None,
    ) -> None:
        self.now = now
        self.memo: ReleaseMemo = {} if memo is None else memo
        state = PoolState.of(nodes)
        shape = state.shape
        self.capacity = shape.capacity
        self.all_schedulable = shape.all_schedulable
        self.node_gpus, self.big_nodes, self.second_gpus = shape.node_gpus, shape.big_nodes, shape.second_gpus
        self.total_gpus = shape.total_gpus
        self.paused = shape.paused
        # Copies of the state's dicts (C-level, its lists shared: a pass replaces them, never edits them).
        self.free: dict[str, list[int]] = dict(state.free)
        self.cache_nodes = state.cache_nodes
        self.no_span = state.no_span
        # Nodes that may hold a part of a job spanning nodes: every node, unless some cannot isolate such parts.
        # A job spanning nodes is placed on these only: their shape is the one that counts for it.
        self.span_capacity = self.capacity
        if self.no_span:
            self.span_capacity = {n: k for n, k in self.capacity.items() if n not in self.no_span}
            self.big_nodes, self.second_gpus = _wide_shape(list(self.span_capacity.values()), self.node_gpus)
        self.short = state.index.copy()
        self.long = state.index.copy()
        self.room = _Room(nodes) if state.offers else None
        # What the largest disk holds in all, among the nodes taking work and among all (draining, held).
        self.largest_disk, self.largest_disk_paused = _largest_disks(nodes) if state.offers else (INF, INF)
        self.running = running
        self.soft: dict[str, int] = {}
        self.soft_jobs: dict[str, list[RunningView]] = {}
        for r in running if any_preemptible(running) else ():
            if r.preemptible:
                for name, idx in r.gpus_by_node.items():
                    if name in self.capacity:
                        self.soft[name] = self.soft.get(name, 0) + len(idx)
                        self.soft_jobs.setdefault(name, []).append(r)
        self.reserved_hard: dict[str, int] = {}
        self.returning: dict[str, int] = {}  # GPUs of starts due back before the first reservation
        self.reserved_soft: dict[str, int] = {}
        self.first_reservation = INF
        self.held: list[Held] = []
        self.local_events: list[tuple[float, dict[str, int]]] = []  # ends of this pass's starts/holds
        self.starts: list[Start] = []
        self.started_gpus: dict[int, int] = {}
        self.preempted: dict[int, None] = {}
        self.preempt_spare: dict[str, list[int]] = {}  # GPUs of preempted jobs no hold claimed yet
        self.preempt_ready: dict[int, dict[str, tuple[int, ...]]] = {}
        self.preempt_stopped_by: dict[
            str, float
        ] = {}  # when the last job preempted on a node will have stopped
        self._releases: list[RunningView] | None = None
        self._sweep: _Sweep | None = None
        self._by_node: dict[str, list[RunningView]] | None = None
        # GPU models: read only once a job names one (``use_models``); until then no check is made.
        self._nodes = nodes
        self.kinds: dict[str, _Kind] | None = None
        self.node_models: dict[str, str] = {}
        self.node_sizes: dict[str, int] = {}

    # ----- GPU models

    def use_models(self) -> dict[str, _Kind]:
        """Some job names a GPU model: from now on such a job is placed, reserved for and judged possible only on
        nodes of that model (``kind``). Returns the models' shapes built so far."""
        if self.kinds is None:
            self.kinds = {}
            self.node_models = {n.name: n.gpu_model for n in self._nodes}
            self.node_sizes = {n.name: n.gpus for n in self._nodes}
        return self.kinds

    def kind(self, job: PendingJob) -> Pass | _Kind:
        """The shape ``job`` is placed by: its model's nodes where it names one, else the whole pool (the pass)."""
        if self.kinds is None or not job.gpu_model:
            return self
        return self.model_kind(job.gpu_model)

    def model_kind(self, model: str) -> _Kind:
        """The schedulable nodes of GPU model ``model`` (as a job asks for it), built on first use."""
        kinds = self.use_models()
        kind = kinds.get(model)
        if kind is None:
            kind = kinds[model] = _Kind.of(self, model)
        return kind

    # ----- feasibility

    def ever_holds(self, job: PendingJob) -> bool:
        """Whether the schedulable pool could ever start ``job``: its GPUs, its memory and CPUs on the nodes that
        would hold them, and its space on some node's disk (not matched node by node: see ``_Room``)."""
        g = job.min_gpus or job.gpus
        s = self.kind(job)
        return self.ever_fits(g, s) and job.space <= self.largest_disk and self.ever_has_room(job, g, s)

    def ever_has_room(self, job: PendingJob, g: int, s: Pass | _Kind | None = None) -> bool:
        """Whether nodes that would hold ``g`` GPUs of the job (as ``_place`` chooses them: one node when it
        fits one, else whole nodes and one for the rest) could, idle, give each part its memory and CPUs;
        among the nodes of shape ``s`` (its model's, or by default the whole pool)."""
        room = self.room
        if room is None or (job.memory is None and job.cpus is None):
            return True
        s = self if s is None else s
        capacity, size = s.capacity, s.node_gpus
        if g <= size:
            return any(k >= g and room.ever_fits(job, node, g, g) for node, k in capacity.items())
        whole, rest = divmod(g, size)
        spanning = [node for node in capacity if node not in self.no_span]
        full = [n for n in spanning if capacity[n] == size and room.ever_fits(job, n, size, g)]
        if rest == 0:
            return len(full) >= whole
        for_rest = [n for n in spanning if capacity[n] >= rest and room.ever_fits(job, n, rest, g)]
        return len(full) >= whole and len(set(full) | set(for_rest)) > whole and bool(for_rest)

    def ever_fits(self, g: int, s: Pass | _Kind | None = None) -> bool:
        """Whether the schedulable pool (or the nodes of shape ``s``) could hold ``g`` GPUs under the placement
        rules."""
        s = self if s is None else s
        if s.node_gpus == 0:
            return False
        if g <= s.node_gpus:
            return g > 0
        whole, rest = divmod(g, s.node_gpus)
        if s.big_nodes < whole:
            return False
        return rest == 0 or s.big_nodes > whole or s.second_gpus >= rest

    # ----- placement now

    def place(self, job: PendingJob, g: int, *, view: _FreeIndex) -> dict[str, int] | None:
        """Counts per node for ``g`` GPUs in ``view``, or None when they do not fit now (GPUs, and
        on nodes that advertise them, memory and CPUs); on a node whose disk holds the job's space
        where one can take it, else where the rest fits (``_Room``)."""
        room = self.room
        if room is None or not room.disk:
            return self._place(job, g, view=view)
        room.refused_for_disk = False
        counts = self._place(job, g, view=view)
        if counts is None and room.refused_for_disk:
            room.counting_disk = False
            try:
                counts = self._place(job, g, view=view)
            finally:
                room.counting_disk = True
        return counts

    def _place(self, job: PendingJob, g: int, *, view: _FreeIndex) -> dict[str, int] | None:
        room = self.room
        s = self.kind(job)
        size = s.node_gpus
        if g <= size:
            if s is self:  # no model asked for: the common case, and every replay
                accept = None if room is None else (lambda node: room.fits(job, node, g, g))
            else:
                accept = self._accept(job, s, g, g)
            local = self._local_fit(job, g, view)
            node = local if local and (accept is None or accept(local)) else view.best_fit(g, accept=accept)
            return None if node is None else {node: g}
        whole, rest = divmod(g, size)
        span = s.span_capacity  # nodes that may hold a part of a job spanning nodes (of its model)
        full = [node for node in view.buckets[size] if node in span]
        if len(full) < whole:
            return None
        chosen: dict[str, int] = {}
        for node in full:
            if len(chosen) == whole:
                break
            if room is None or room.fits(job, node, size, g):
                chosen[node] = size
        if len(chosen) < whole:
            return None
        if rest:
            accept = self._accept(job, s, rest, g)
            node = view.best_fit(rest, exclude={**chosen, **self.no_span}, accept=accept)
            if node is None:
                return None
            chosen[node] = rest
        return chosen

    def _accept(self, job: PendingJob, s: Pass | _Kind, k: int, total: int) -> Callable[[str], bool] | None:
        """Which nodes may take ``k`` of the job's ``total`` GPUs: those of its model, with room for its part."""
        room = self.room
        if s is self:
            return None if room is None else (lambda node: room.fits(job, node, k, total))
        ours = s.capacity
        if room is None:
            return ours.__contains__
        return lambda node: node in ours and room.fits(job, node, k, total)

    def held_back_by_room(self, job: PendingJob) -> bool:
        """Whether idle GPUs could take ``job`` now, and only memory or CPUs on those nodes stop it."""
        room, self.room = self.room, None
        try:
            return room is not None and self.place(job, job.min_gpus or job.gpus, view=self.short) is not None
        finally:
            self.room = room

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
        returns = not from_tail and self.first_reservation < INF
        gpus_by_node = {}
        for node, k in counts.items():
            idx = self.free[node]
            if returns:
                self.returning[node] = self.returning.get(node, 0) + k
            if from_tail:
                taken, self.free[node] = idx[len(idx) - k :], idx[: len(idx) - k]
            else:
                taken, self.free[node] = idx[:k], idx[k:]
            gpus_by_node[node] = tuple(sorted(taken))
            self._sync(node)
            if self.room is not None:
                self.room.take(job, node, k, sum(counts.values()))
        self.local_events.append((end, dict(counts)))
        return gpus_by_node

    def _sync(self, node: str) -> None:
        """Both views of ``node``. GPUs of a start that ends before the first reservation come back
        in time for it, so they count towards the reservation's idle GPUs (EASY's extra GPUs)."""
        free = len(self.free.get(node, ()))
        self.short.set(node, free)
        unreserved = free + self.returning.get(node, 0) - self.reserved_hard.get(node, 0)
        self.long.set(node, max(0, min(free, unreserved)))

    def start(self, job: PendingJob, counts: Mapping[str, int]) -> None:
        end = self.now + job.hours * HOUR_S
        self.starts.append(Start(job_id=job.job_id, gpus_by_node=self.take(job, counts, end=end)))
        if self._sweep is not None:
            self._sweep.note_start(counts, end)
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
        s = self.kind(job)
        size = s.node_gpus
        if s is self:
            whole_gpus, top = len(view.buckets[size]) * size, view.top
        else:  # only its model's nodes count
            whole_gpus = sum(node in s.capacity for node in view.buckets[size]) * size if size else 0
            top = max(map(view.get, s.capacity), default=0)
        if job.gpus > size and whole_gpus > size:
            g = min(job.gpus, whole_gpus)
            g -= g % size
        else:
            g = min(job.gpus, top)
        if g < (job.min_gpus or job.gpus) or g <= 0:
            return None
        return self.place(job, g, view=view)

    # ----- reservations

    def releases(self) -> list[RunningView]:
        """Non-preemptible running jobs by expected end (preemptible ones count as free already)."""
        if self._releases is None:
            ordered = by_expected_end(self.running)
            self._releases = [r for r in ordered if not r.preemptible] if self.soft_jobs else list(ordered)
        return self._releases

    def base_avail(self) -> dict[str, int]:
        """Per node: idle + backlog GPUs now, less what holds of this pass captured now."""
        avail = dict(self.short.count)
        for node, k in self.soft.items():
            avail[node] = avail.get(node, 0) + k
        for held in (self.reserved_hard, self.reserved_soft):
            for node, k in held.items():
                avail[node] = avail.get(node, 0) - k
        return avail

    def reserve(self, job: PendingJob) -> Held | None:
        """Earliest start of ``job`` by declared hours at or after the holds made before it in this
        pass, without moving any of them; None if the schedulable pool never fits it."""
        if self._sweep is None:
            self._sweep = _Sweep(self)
        shape = self.kind(job)
        # An elastic job whose full size no placement ever gives (2 whole nodes and 4 more of 8+8+2+2) holds the most
        # it can, down to its minimum, as it would start with when they free: held for nothing, it would wait for
        # ever behind every smaller job, starved or not. ``ever_fits`` finds that size at once, with no walk of the
        # releases for a size that never fits (a walk per size took 17 s on 4,000 nodes).
        sizes = range(job.gpus, (job.min_gpus or job.gpus) - 1, -1)
        most = next((g for g in sizes if self.ever_fits(g, shape)), None)
        found = None if most is None else self._sweep.hold(most, hours=job.hours, shape=shape)
        if found is None:
            return None
        start_at, need, released = found
        from_releases = {
            node: min(k, released.get(node, 0)) for node, k in need.items() if released.get(node)
        }
        hold = Held(job=job, start_at=start_at, need=need, from_releases=from_releases)
        due_now = start_at <= self.now
        parts = {}
        for node, k in need.items():
            from_releases = released.get(node, 0)
            if from_releases < k:  # a busy node's hold comes all from releases: nothing idle is touched
                parts[node] = self._capture(node, k, from_releases=from_releases, idle_first=due_now)
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

    def _preempt_for(self, hold: Held, parts: Mapping[str, tuple[int, int]]) -> None:
        """A hold due now on backlog GPUs: its idle GPUs, then backlog jobs preempted - checkpointing ones first
        (they lose at most the time since their last checkpoint, the others all their work), the widest first."""
        ready: dict[str, tuple[int, ...]] = {}
        for node, (idle_k, soft_k) in parts.items():
            idle = self.free.get(node, [])
            # Unreserved idle GPUs sit at the tail (reserved ones are counted from the front).
            use, self.free[node] = idle[len(idle) - idle_k :], idle[: len(idle) - idle_k]
            self.reserved_hard[node] -= idle_k
            self._sync(node)
            spare = self.preempt_spare.setdefault(node, [])
            backlog = sorted(
                self.soft_jobs.get(node, ()), key=lambda r: (not r.checkpoints, -len(r.gpus_by_node[node]))
            )
            for r in backlog:
                if len(spare) >= soft_k:
                    break
                if r.job_id not in self.preempted:
                    self.preempted[r.job_id] = None
                    spare.extend(r.gpus_by_node[node])
                    stopped = (self.now if r.preempt_asked_at is None else r.preempt_asked_at) + r.yield_s
                    self.preempt_stopped_by[node] = max(self.preempt_stopped_by.get(node, self.now), stopped)
            use, self.preempt_spare[node] = use + spare[:soft_k], spare[soft_k:]
            ready[node] = tuple(sorted(use))
        self.preempt_ready[hold.job.job_id] = ready

    def preempted_by(self, hold: Held) -> float:
        """When the backlog jobs a hold due now preempts will all have stopped (each has its grace to, from when
        it was asked); no sooner than now."""
        nodes = self.preempt_ready.get(hold.job.job_id, {})
        return max([self.now, *(self.preempt_stopped_by.get(node, self.now) for node in nodes)])

    def reservation_gpus(self, hold: Held) -> dict[str, tuple[int, ...]]:
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
            backlog = [i for r in self.soft_jobs.get(node, ()) for i in r.gpus_by_node[node]]
            out[node] = tuple(sorted((ending + backlog + self.free.get(node, []))[:k]))
        return out


def _releases_of(r: RunningView, memo: ReleaseMemo) -> list[tuple[float, str, int]]:
    """A running job's release events, from ``memo`` when it holds this very view.

    The identity check makes a hit exact: a new view for the same job (the live scheduler builds
    new ones each pass) is computed afresh. Callers must not mutate a view's gpus_by_node in place.
    """
    hit = memo.get(r.job_id)
    if hit is not None and hit[0] is r:
        return hit[1]
    events = [(r.expected_end, n, len(ix)) for n, ix in r.gpus_by_node.items()]
    memo[r.job_id] = (r, events)
    return events


def _prune_release_memo(memo: ReleaseMemo, running: int) -> None:
    if len(memo) > 4 * running + 4096:
        memo.clear()  # rebuilt on demand from the jobs still running


class _Sweep:
    """One forward walk per pass over releases, placing holds in priority order.

    Availability per node starts at idle + backlog (soft) GPUs now and changes as the walk moves
    forward: running jobs' expected ends and this pass's starts' ends add GPUs, each hold takes its
    GPUs at its start and returns them at its end. Each hold is the earliest time at or after the
    previous one when its job fits - so holds never move each other, and starved jobs keep
    first-come-first-served order - at the cost of one walk per pass instead of one per hold.
    ``released`` per node records how many of a hold's GPUs come from releases (the rest are
    idle or backlog GPUs now), which is what the backfill views need.
    """

    def __init__(self, p: Pass) -> None:
        self.p = p
        self.avail = p.base_avail()
        self.t = p.now
        # Running jobs' releases are expanded into ``events`` lazily, a few jobs at a time, as the
        # walk reaches them (most walks stop early); ends of this pass's starts and holds are
        # spliced in, or wait in ``deferred`` while they lie beyond what is expanded.
        self.jobs, self.ji = p.releases(), 0
        _prune_release_memo(p.memo, len(p.running))
        self.events: list[tuple[float, str, int]] = []
        self.i = 0
        self.frontier = -INF
        self.deferred: list[tuple[float, str, int]] = []
        for end, counts in p.local_events:
            self._splice(end, counts)
        self.gained: dict[str, int] = {}  # GPUs added by releases so far, per node
        self.owed: dict[str, int] = {}  # of those, what earlier holds took
        # Nodes wholly available at the walk's present (among those that may hold a spanning job's part), kept up
        # to date as it moves: wide holds (most reservations on a busy pool) then never rescan every node.
        size, cap = p.node_gpus, p.span_capacity
        self.wholes = {n: None for n, a in self.avail.items() if a >= size and cap.get(n, 0) == size}

    def _take(self, counts: Mapping[str, int]) -> None:
        avail, wholes, size = self.avail, self.wholes, self.p.node_gpus
        for node, k in counts.items():
            avail[node] = left = avail.get(node, 0) - k
            if left < size and node in wholes:
                del wholes[node]

    def _splice(self, end: float, counts: Mapping[str, int]) -> None:
        batch = [(end, n, k) for n, k in counts.items()]
        if end <= self.frontier:
            at = bisect_right(self.events, end, lo=self.i, key=_first)
            self.events[at:at] = batch
        else:
            at = bisect_right(self.deferred, end, key=_first)
            self.deferred[at:at] = batch

    def _expand(self) -> bool:
        """Append the next few running jobs' releases (and deferred ends now behind them)."""
        jobs, ji = self.jobs, self.ji
        if ji >= len(jobs):
            if not self.deferred:
                return False
            self.events += self.deferred
            self.deferred, self.frontier = [], INF
            return True
        stop = min(ji + 16, len(jobs))
        cap, unfiltered = self.p.capacity, self.p.all_schedulable
        for r in jobs[ji:stop]:
            if unfiltered:
                self.events += _releases_of(r, self.p.memo)
            else:
                self.events += [e for e in _releases_of(r, self.p.memo) if e[1] in cap]
        self.ji, self.frontier = stop, jobs[stop - 1].expected_end
        if self.deferred and self.deferred[0][0] <= self.frontier:
            cut = bisect_right(self.deferred, self.frontier, key=_first)
            merged = sorted(self.events[self.i :] + self.deferred[:cut])  # two sorted runs: linear
            self.events[self.i :] = merged
            del self.deferred[:cut]
        return True

    def note_start(self, counts: Mapping[str, int], end: float) -> None:
        """A start made now after the walk has moved on: it holds its GPUs until ``end``."""
        if end <= self.t:
            return  # back before the walk's present: no effect on what is available then
        self._take(counts)
        self._splice(end, counts)

    def hold(
        self, g: int, *, hours: float, shape: Pass | _Kind
    ) -> tuple[float, dict[str, int], dict[str, int]] | None:
        """Place a hold for ``g`` GPUs for ``hours`` on nodes of ``shape`` (the pass: any node): (start, GPUs per
        node, of which released). None when it never fits: the walk is then back where it was, so that the holds
        after it are found among the GPUs available then, not at the end of every release."""
        if shape.node_gpus == 0:
            return None  # no node of its model takes work
        # Where the walk stands (what a walk moves; ``events`` only grows, in time order, behind ``i`` unchanged).
        at = self.t, self.i, dict(self.avail), dict(self.gained), dict(self.wholes)
        if g > shape.node_gpus:
            need = self._advance_multi(g) if shape is self.p else self._advance_multi_of(g, shape)
        else:
            cap = shape.capacity
            need = _fit_single_now(self.p, g, self.avail, cap) or self._advance_single(g, cap)
        if need is None:
            self.t, self.i, self.avail, self.gained, self.wholes = at
            return None
        released = {}
        gained, owed = self.gained, self.owed
        for node, k in need.items():
            spare = gained.get(node, 0) - owed.get(node, 0)
            if spare > 0:
                released[node] = took = min(k, spare)
                owed[node] = owed.get(node, 0) + took
        self._take(need)
        self._splice(self.t + hours * HOUR_S, need)
        return max(self.t, self.p.now), need, released

    def _absorb_ties(self, i: int, t: float) -> list[str]:
        """Apply every other release at ``t`` after event ``i``: a hold found at ``t`` then sees all
        GPUs released at that moment and takes them before idle ones (EASY's shadow time).
        Returns the nodes whose GPUs were released at ``t``."""
        events, avail, gained, span = self.events, self.avail, self.gained, self.p.span_capacity
        wholes, size = self.wholes, self.p.node_gpus
        touched = [events[i][1]]
        i += 1
        while True:
            while i < len(events) and events[i][0] <= t:
                _, node, k = events[i]
                a = avail.get(node, 0) + k
                avail[node] = a
                gained[node] = gained.get(node, 0) + k
                if a >= size > a - k and span.get(node, 0) == size:
                    wholes[node] = None
                touched.append(node)
                i += 1
            if i < len(events) or not self._expand():
                break
        self.t, self.i = t, i
        return touched

    def _advance_single(self, g: int, cap: Mapping[str, int]) -> dict[str, int] | None:
        """The first node of ``cap`` (the pool's or a model's capacity) with ``g`` GPUs available."""
        events, avail, gained = self.events, self.avail, self.gained
        wholes, size, span = self.wholes, self.p.node_gpus, self.p.span_capacity
        while True:
            for i in range(self.i, len(events)):
                t, node, k = events[i]
                a = avail.get(node, 0) + k
                avail[node] = a
                gained[node] = gained.get(node, 0) + k
                if a >= size > a - k and span.get(node, 0) == size:
                    wholes[node] = None
                if a >= g and cap.get(node, 0) >= g:
                    touched = self._absorb_ties(i, t)
                    idle = self.p.short.count
                    fits = [n for n in touched if avail[n] >= g and cap.get(n, 0) >= g]
                    return {min(fits, key=lambda n: (idle.get(n, 0), avail[n])): g}
            self.i = len(events)
            if not self._expand():
                return None

    def _advance_multi(self, g: int) -> dict[str, int] | None:
        """Watches whole nodes (and nodes able to take the remainder) as releases come in."""
        events, avail, gained = self.events, self.avail, self.gained
        cap = self.p.span_capacity  # only nodes that may hold a spanning job's part
        wholes, size = self.wholes, self.p.node_gpus
        whole, rest = divmod(g, size)
        n_rest = sum(1 for n, a in avail.items() if a >= rest and cap.get(n, 0) >= rest) if rest else 0
        if len(wholes) >= whole and (not rest or n_rest > whole):
            return _fit_multi(self.p, g, avail, wholes)  # fits at the walk's present
        while True:
            for i in range(self.i, len(events)):
                t, node, k = events[i]
                old = avail.get(node, 0)
                a = old + k
                avail[node] = a
                gained[node] = gained.get(node, 0) + k
                grew_whole = old < size <= a and cap.get(node, 0) == size
                if grew_whole:
                    wholes[node] = None
                grew_rest = rest and old < rest <= a and cap.get(node, 0) >= rest
                if not (grew_whole or grew_rest):
                    continue
                n_rest += bool(grew_rest)
                if len(wholes) >= whole and (not rest or n_rest > whole):
                    self._absorb_ties(i, t)
                    return _fit_multi(self.p, g, avail, wholes)
            self.i = len(events)
            if not self._expand():
                return None

    def _advance_multi_of(self, g: int, kind: _Kind) -> dict[str, int] | None:
        """``_advance_multi`` on the nodes of one GPU model (whole nodes of its largest size), keeping the
        pool's whole nodes up to date as it walks."""
        events, avail, gained = self.events, self.avail, self.gained
        cap, size = kind.span_capacity, kind.node_gpus
        pool_wholes, pool_size, pool_span = self.wholes, self.p.node_gpus, self.p.span_capacity
        whole, rest = divmod(g, size)

        def fit() -> dict[str, int] | None:
            # Its model's nodes as large as the pool's: the pool's whole nodes, in the order the pool's walk keeps them.
            if size == pool_size:
                wholes = {n: None for n in pool_wholes if n in cap}
            else:
                wholes = {n: None for n, a in avail.items() if a >= size and cap.get(n, 0) == size}
            n_rest = sum(1 for n, k in cap.items() if k >= rest and avail.get(n, 0) >= rest) if rest else 0
            if len(wholes) >= whole and (not rest or n_rest > whole):
                return _fit_multi(self.p, g, avail, wholes, kind)
            return None

        found = fit()
        if found is not None:
            return found
        while True:
            for i in range(self.i, len(events)):
                t, node, k = events[i]
                old = avail.get(node, 0)
                a = old + k
                avail[node] = a
                gained[node] = gained.get(node, 0) + k
                if old < pool_size <= a and pool_span.get(node, 0) == pool_size:
                    pool_wholes[node] = None
                grown = (old < size <= a and cap.get(node, 0) == size) or (
                    rest and old < rest <= a and cap.get(node, 0) >= rest
                )
                if grown:
                    self._absorb_ties(i, t)  # the walk's present is t now, every release at t applied
                    found = fit()
                    if found is not None:
                        return found
                    break  # not yet: go on from the first event after t
            else:
                self.i = len(events)
                if not self._expand():
                    return None
                continue


def _fit_single_now(
    p: Pass, g: int, avail: Mapping[str, int], cap: Mapping[str, int]
) -> dict[str, int] | None:
    """A single-node job that fits at once (on backlog GPUs): best fit, then fewest preempted."""
    soft = p.soft
    fits = [(k, soft.get(n, 0), n) for n, k in avail.items() if k >= g and cap.get(n, 0) >= g]
    return {min(fits)[2]: g} if fits else None


def _fit_multi(
    p: Pass, g: int, avail: Mapping[str, int], wholes: Mapping[str, None], s: Pass | _Kind | None = None
) -> dict[str, int] | None:
    """Whole nodes of the largest size, plus one node for any remainder, if ``avail`` has them; among the
    nodes of shape ``s`` (a GPU model's; by default the whole pool).

    ``wholes`` are the nodes wholly available. It takes those with no GPU idle now first: a hold
    then counts on GPUs that are busy anyway, and idle GPUs stay free for backfill.
    """
    s = p if s is None else s
    whole, rest = divmod(g, s.node_gpus)
    if len(wholes) < whole:
        return None
    idle, cap = p.short.count, s.span_capacity
    busy = [n for n in wholes if n not in idle]
    if len(busy) < whole:
        busy += sorted((n for n in wholes if n in idle), key=idle.__getitem__)
    chosen = dict.fromkeys(busy[:whole], s.node_gpus)
    if rest:
        extras = [n for n, a in avail.items() if a >= rest and cap.get(n, 0) >= rest and n not in chosen]
        if not extras:
            return None
        chosen[min(extras, key=lambda n: (idle.get(n, 0), avail[n]))] = rest
    return chosen


# --------------------------------------------------------------------------- the pass


@dataclass(frozen=True, slots=True)
class Outcome:
    started: dict[int, int]  # job id -> GPUs
    held: dict[int, Held]
    never: set[int]
    blocked: list[PendingJob]  # in priority order: neither started, held, nor impossible


def run(
    *,
    now: float,
    nodes: Sequence[NodeView],
    running: Sequence[RunningView],
    order: Sequence[PendingJob],
    config: PolicyConfig,
    starved: frozenset[int] = frozenset(),
    backfill: bool = True,
    explainer: explanation.Explainer | None = None,
    memo: ReleaseMemo | None = None,
) -> tuple[Plan, Afterwards]:
    """Run one pass over ``order`` (highest priority first); the engine under every policy. Returns its plan, and
    what can still estimate jobs the pass left out, from the state it ended in.

    ``backfill=False`` is strict first-come-first-served: stop at the first job that cannot start.
    """
    p = Pass(now=now, nodes=nodes, running=running, memo=memo)
    if any(map(_gpu_model, order)):  # C-level: a pass where no job names a model checks none
        p.use_models()
    outcome = _place_all(p, order, config=config, starved=starved, backfill=backfill)
    reservations = [
        Reservation(
            job_id=h.job.job_id,
            start_at=h.start_at,
            gpus_by_node=p.reservation_gpus(h) if config.explain or h.job.job_id in p.preempt_ready else None,
        )
        for h in p.held
    ]
    explainer = explainer or explanation.Explainer()
    plan = Plan(
        starts=p.starts,
        preemptions=list(p.preempted),
        reservations=reservations,
        estimates=explainer.estimates(p, order, outcome) if config.explain else {},
        priority={},
    )
    return plan, Afterwards(p, explainer)


def schedule(**pass_args: Any) -> Plan:
    """``run``'s plan alone (the same keyword arguments), for a policy that estimates nothing after the pass."""
    return run(**pass_args)[0]


class Afterwards:
    """Estimates for jobs a pass left out of its order (held back until a known time: their prerequisites'
    ends), read from the state the pass ended in: its starts and holds made, running jobs' ends to come."""

    def __init__(self, p: Pass, explainer: explanation.Explainer) -> None:
        self._p, self._explainer = p, explainer

    def estimate(self, jobs: Sequence[PendingJob]) -> dict[int, Estimate]:
        """Each job as if it had been placed last in the pass: ``start_at`` None (with the pass's reason) when
        the pool can never place it, else when it could start, no earlier than its ``ready_at``: as a blocked
        job, with only the jobs before it in ``jobs`` counted ahead of it. Changes no decision of the pass."""
        p = self._p
        if any(map(_gpu_model, jobs)):
            p.use_models()
        outcome = Outcome(started={}, held={}, never=set(), blocked=[])
        outcome.blocked.extend(_rest(p, jobs, outcome.never))
        return self._explainer.estimates(p, jobs, outcome)


def _place_all(
    p: Pass, order: Sequence[PendingJob], *, config: PolicyConfig, starved: frozenset[int], backfill: bool
) -> Outcome:
    """Non-preemptible jobs in priority order, then backlog jobs on whatever is still idle.

    Phase 1 walks the order while reservations are still due (starved jobs, then the top
    ``reserve_top`` blocked jobs). Phase 2 only backfills: a cheap size/length test skips jobs
    that cannot fit, and the scan ends when nothing later could fit on what is idle.
    """
    out = Outcome(started={}, held={}, never=set(), blocked=[])
    backlog: list[PendingJob] = []
    if not backfill:
        return _strict(p, order, out, backlog, config)
    top_holds = 0
    resume = len(order)
    for i, job in enumerate(order):
        is_starved = job.job_id in starved
        if not (is_starved or top_holds < config.reserve_top) or len(out.held) >= config.max_reservations:
            resume = i
            break
        if not _consider(p, job, out, backlog):
            continue
        if not is_starved and p.held_back_by_room(job):
            # Its GPUs are idle now and only memory or CPUs stop it: a hold due now would keep them idle for as long
            # as that lasts, of no use to it (a short limit and a node's memory pinned GPUs for days). The next job
            # reserves instead; once starved it holds, so small jobs cannot take each node's room as it frees.
            out.blocked.append(job)
            continue
        hold = p.reserve(job)
        if hold is None:
            out.blocked.append(job)
        else:
            out.held[job.job_id] = hold
            top_holds += not is_starved
    _backfill(p, order[resume:], out, backlog, config)
    return _finish(p, out, backlog, (), config)


def _strict(
    p: Pass, order: Sequence[PendingJob], out: Outcome, backlog: list[PendingJob], config: PolicyConfig
) -> Outcome:
    """First-come-first-served without backfill: stop at the first job that has to wait."""
    for i, job in enumerate(order):
        if _consider(p, job, out, backlog):
            out.blocked.append(job)
            return _finish(p, out, backlog, order[i + 1 :], config)
    return _finish(p, out, backlog, (), config)


def _consider(p: Pass, job: PendingJob, out: Outcome, backlog: list[PendingJob]) -> bool:
    """Start ``job`` now if it can; True when it is still waiting for GPUs (not started, possible)."""
    if not p.ever_holds(job):
        out.never.add(job.job_id)
        return False
    if job.ready_at is not None and job.ready_at > p.now:
        out.blocked.append(job)
        return False
    if job.preemptible:
        backlog.append(job)
        return False
    return not p.try_start(job)


def _backfill(
    p: Pass, jobs: Sequence[PendingJob], out: Outcome, backlog: list[PendingJob], config: PolicyConfig
) -> None:
    """Start whatever fits without touching a reservation; the hot loop of a busy pool.

    A job is a candidate if it fits the unreserved idle GPUs, or fits the idle ones and ends (by
    declared hours) before the first reservation. Candidates are found by one comprehension (slot
    reads and comparisons Python 3.11 specialises: several times faster here than chains of C-level
    maps), so the loop below only visits jobs that may start; it re-checks each against what is left.
    """
    horizon = (p.first_reservation - p.now) / HOUR_S + 1e-9  # hours until the first reservation
    short_top, long_top = _widest(p, p.short), _widest(p, p.long)
    visited: set[int] = set()
    if jobs and short_top:
        candidates = [
            i
            for i, job in enumerate(jobs)
            if (g := job.min_gpus or job.gpus) <= long_top or (g <= short_top and job.hours <= horizon)
        ]
        for i in candidates:
            job = jobs[i]
            g = job.min_gpus or job.gpus
            if g > short_top or (g > long_top and job.hours > horizon):
                continue  # what was idle is gone
            visited.add(i)
            if _consider(p, job, out, backlog):
                out.blocked.append(job)
            else:
                short_top, long_top = _widest(p, p.short), _widest(p, p.long)
                if not short_top:
                    break
    if config.explain:
        out.blocked.extend(_rest(p, [j for i, j in enumerate(jobs) if i not in visited], out.never))


def _widest(p: Pass, view: _FreeIndex) -> int:
    """An upper bound on the widest job ``view`` could place now: a node's worth, or whole nodes
    plus a remainder when some node is wholly idle."""
    if view.top < p.node_gpus:
        return view.top
    return (len(view.buckets[p.node_gpus]) + 1) * p.node_gpus - 1


def _finish(
    p: Pass, out: Outcome, backlog: list[PendingJob], unreached: Sequence[PendingJob], config: PolicyConfig
) -> Outcome:
    """Backlog jobs take what is still idle; record the starts."""
    for job in backlog:
        if not p.try_start(job):
            out.blocked.append(job)
    if config.explain:
        out.blocked.extend(_rest(p, unreached, out.never))
    out.started.update(p.started_gpus)
    return out


def _rest(p: Pass, jobs: Sequence[PendingJob], never: set[int]) -> list[PendingJob]:
    """Jobs the scan did not reach: impossible ones go to ``never``, the others are returned."""
    rest = []
    for job in jobs:
        if p.ever_holds(job):
            rest.append(job)
        else:
            never.add(job.job_id)
    return rest
