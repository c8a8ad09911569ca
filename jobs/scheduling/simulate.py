"""Replay a real workload trace through the scheduling policy and its baselines, and compare them.

    python -m jobs.scheduling.simulate --trace FILE [--nodes N --gpus-per-node G | --load L]
        --policies default,easy-nodes,easy,sjf-easy,fcfs --json [--plot out.svg] [--limit N] [--procs-per-gpu P]
        [--estimates declared|learned|exact]

Event-driven with a simulated clock: at each distinct submit or finish time (with jobs waiting,
and some GPU idle or preemptible - otherwise no policy could start anything) the policy's
``plan()`` runs once (the same function the live scheduler calls; ``explain=False``, so it skips
the sentences but decides the same) and its starts and preemptions are applied. Jobs run for their
trace run time; the policy knows their declared hours, or with ``--estimates learned`` their team's learned
prediction (``jobs.scheduling.prediction``; for backfill and estimated starts: it ranks them by their declared
hours, as live), or with ``exact`` the run time itself (as if declared). Team usage is metered exactly
(decayed GPU-seconds, updated at each start and finish). Policies: ``default`` (the policy),
``easy-nodes`` (EASY on the policy's own node-aware engine: the fair comparison on the same pool),
and the textbook flat-pool references of ``jobs.scheduling.baselines``: ``easy``, ``sjf-easy``,
``fcfs``.

Pool: ``--nodes``; or ``--load L``, whole nodes such that total GPU-seconds / (pool GPUs x submit
span) is L (raised if the largest job would not fit); or, for SWF, the machine in its header.
Jobs larger than the pool are dropped (counted). SWF processors map 1:1 to GPUs by default, so a
node of 8 cores becomes a node of 8 GPUs and the machine keeps its size and offered load
(``--procs-per-gpu 8`` gives ceil(procs / 8) GPUs instead; then size the pool with ``--load``).

The last stdout line is JSON; per policy: wait percentiles (nearest rank) and max; mean bounded
slowdown ``max((wait + run) / max(run, 10), 1)``; utilisation = GPU-seconds used / (pool GPUs x
makespan); makespan_ratio = makespan / max(GPU-seconds / pool GPUs, last submit + its run), both
from the first submit; jain_teams = Jain's index over teams' mean bounded slowdown; bsld_cv = the
bounded slowdowns' standard deviation over their mean (over teams of m jobs drawn at random, Jain's
index is about 1 / (1 + bsld_cv ** 2 / m), so this says why it moved); by_size by
requested GPUs; reservations = jobs reserved, how many started after their first reserved
start (late) and by how much; wall_s = replay seconds. The lines before it say what was assumed.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import math
import statistics
import sys
import time
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter

from jobs.scheduling import baselines, placement, plot, policy, prediction, priority, traces, types
from jobs.scheduling.traces import TraceJob
from jobs.scheduling.types import HOUR_S, NodeView, PendingJob, Plan, PolicyConfig, RunningView

REPLAY_CONFIG = PolicyConfig(explain=False)
POLICIES: dict[str, types.Policy] = {
    "default": policy.plan,
    "easy-nodes": policy.easy_nodes,
    "easy": baselines.easy,
    "sjf-easy": baselines.sjf_easy,
    "fcfs": baselines.fcfs,
}  # decisions only: the replay needs no sentences
LABELS = {
    "default": "default policy",
    "easy-nodes": "EASY-FCFS on the policy's node-aware engine",
    "easy": "textbook EASY-FCFS (flat pool)",
    "sjf-easy": "textbook SJF-EASY (flat pool)",
    "fcfs": "textbook FCFS (flat pool)",
}
SIZE_CLASSES = (("1", 1, 1), ("2-4", 2, 4), ("5-8", 5, 8), (">8", 9, math.inf))


ESTIMATES = ("declared", "learned", "exact")


@dataclass(frozen=True, slots=True)
class Declarations:
    """What the jobs of a replay tell the scheduler beyond their trace row.

    ``estimates``: the run time the policy plans with - the declared hours (today), the team's
    learned ratio x declared hours (``jobs.scheduling.prediction``, from ``min_jobs`` of the team's
    jobs finished earlier in the replay), or the true run time (an oracle, the bound). A learned
    prediction plans backfill and estimated starts only: the job is ranked by its declared hours, as
    live; an exact run time stands for a declaration (a team declaring what its jobs take), ranked by too.
    The shares pick jobs stably (a BLAKE2b hash of the job id, one salt per switch): ``checkpoint_share``
    of them checkpoint every ``checkpoint_interval_s`` (0: continuously) and are preemptible; a
    preempted one loses the work since its last checkpoint and takes ``restore_s`` to resume.
    ``preemptible_share`` are preemptible without checkpoints: preempted, they start over.
    ``elastic_share`` of the multi-GPU jobs may start on half their GPUs (rounded up) and run
    proportionally longer (work conserved). ``wide_share`` of the jobs declare ``max_gpus`` twice
    their GPUs: started wider on idle GPUs, they run proportionally shorter.
    """

    estimates: str = "declared"
    min_jobs: int = prediction.MIN_JOBS
    checkpoint_share: float = 0.0
    preemptible_share: float = 0.0
    elastic_share: float = 0.0
    wide_share: float = 0.0
    checkpoint_interval_s: float = 1800.0
    restore_s: float = 120.0

    def __post_init__(self) -> None:
        if self.estimates not in ESTIMATES:
            raise ValueError(f"estimates {self.estimates!r}: one of {', '.join(ESTIMATES)}")


def _picked(job: TraceJob, share: float, salt: str) -> bool:
    digest = hashlib.blake2b(f"{salt}:{job.job_id}".encode(), digest_size=8).digest()
    return share > 0 and int.from_bytes(digest) / 2**64 < share


def declare(jobs: Sequence[TraceJob], d: Declarations) -> list[TraceJob]:
    """The trace's jobs with the declarations ``d`` asks a share of them to make (the same jobs every run)."""
    if not (d.checkpoint_share or d.preemptible_share or d.elastic_share or d.wide_share):
        return list(jobs)
    out = []
    for j in jobs:
        checkpoints = j.checkpoints or _picked(j, d.checkpoint_share, "checkpoint")
        preemptible = j.preemptible or checkpoints or _picked(j, d.preemptible_share, "preemptible")
        min_gpus = j.min_gpus
        if min_gpus is None and j.gpus > 1 and _picked(j, d.elastic_share, "elastic"):
            min_gpus = (j.gpus + 1) // 2
        max_gpus = j.max_gpus
        if max_gpus is None and _picked(j, d.wide_share, "wide"):
            max_gpus = 2 * j.gpus
        out.append(
            replace(j, checkpoints=checkpoints, preemptible=preemptible, min_gpus=min_gpus, max_gpus=max_gpus)
        )
    return out


TODAY = Declarations()


@dataclass(slots=True)
class Outcome:
    """What happened to one trace job in a replay (``start`` is its first start; ``promised`` the start
    of its first reservation, if it had one)."""

    job: TraceJob
    start: float = math.nan
    end: float = math.nan
    gpu_seconds: float = 0.0
    promised: float = math.nan
    lost_gpu_seconds: float = 0.0  # held for work a preemption threw away, and to restore from checkpoints


class UsageMeter(Mapping[str, float]):
    """Decayed GPU-seconds per team, exact for piecewise-constant use, O(1) per start or finish.

    Between changes a team's usage u with r GPUs busy follows du/dt = r - k u (k = ln 2 / half
    life), so u(t) = u0 d + r (1 - d) / k with d = exp(-k (t - t0)). Reads are at ``self.now``.
    """

    def __init__(self, *, half_life_s: float) -> None:
        self.k = math.log(2.0) / half_life_s
        self.value: dict[str, float] = {}
        self.since: dict[str, float] = {}
        self.rate: dict[str, int] = {}
        self.now = 0.0

    def _at(self, team: str, t: float) -> float:
        d = math.exp(-self.k * (t - self.since[team]))
        return self.value[team] * d + self.rate[team] * (1.0 - d) / self.k

    def change(self, team: str, t: float, delta_gpus: int) -> None:
        if team in self.value:
            self.value[team] = self._at(team, t)
        else:
            self.value[team], self.rate[team] = 0.0, 0
        self.since[team] = t
        self.rate[team] += delta_gpus

    def __getitem__(self, team: str) -> float:
        if team not in self.value:
            raise KeyError(team)
        return self._at(team, self.now)

    def get(self, team: str, default: float = 0.0) -> float:  # type: ignore[override]
        return self._at(team, self.now) if team in self.value else default

    def __iter__(self) -> Iterator[str]:
        return iter(self.value)

    def __len__(self) -> int:
        return len(self.value)


class _Pool:
    """Simulated nodes: free GPUs per node as a bit mask, and the NodeList handed to the policy.

    Totals and which nodes have a free GPU change at once; the nodes' views and the engine's
    free-GPU state (``placement.PoolState``) once per touched node, when a policy is about to
    plan (``views_now``) - a wide job's start and end touch many nodes, often between two passes.
    A node's view depends only on its mask, so each (node, mask) view is built once and reused:
    views are frozen, and a replay revisits the same few masks of each node again and again.
    """

    def __init__(self, *, nodes: int, gpus_per_node: int) -> None:
        self.gpus = gpus_per_node
        names = [f"gpu-{i:04d}" for i in range(nodes)]
        full = (1 << gpus_per_node) - 1
        self.mask = dict.fromkeys(names, full)
        self.idle = nodes * gpus_per_node
        self.pos = {n: i for i, n in enumerate(names)}
        self.views = types.NodeList(
            NodeView(name=n, gpus=gpus_per_node, free=tuple(range(gpus_per_node))) for n in names
        )
        self.views.total_gpus = self.views.free_gpus = self.idle
        self.views.with_free = dict.fromkeys(range(nodes))
        self.views.state = placement.PoolState(self.views, kept=True)
        self._built: dict[tuple[str, int], NodeView] = {(v.name, full): v for v in self.views}
        self._bits: dict[tuple[int, ...], int] = {}
        self.touched: dict[str, None] = {}

    def _bits_of(self, idx: tuple[int, ...]) -> int:
        """The mask of these GPU indices (starts hand out the same few tuples: each is summed once)."""
        bits = self._bits.get(idx)
        if bits is None:
            bits = 0
            for i in idx:
                bits |= 1 << i
            self._bits[idx] = bits
        return bits

    def _view(self, node: str, mask: int) -> NodeView:
        view = self._built.get((node, mask))
        if view is None:
            free = tuple(i for i in range(self.gpus) if mask >> i & 1)
            view = self._built[node, mask] = NodeView(name=node, gpus=self.gpus, free=free)
        return view

    def views_now(self) -> types.NodeList:
        """The nodes as the policy must see them now."""
        views, pos, mask, built = self.views, self.pos, self.mask, self._built
        for node in self.touched:
            # Inlined lookup: hundreds of touched nodes a pass, nearly all of them hits.
            views[pos[node]] = built.get((node, mask[node])) or self._view(node, mask[node])
        views.state.changed(self.touched)
        self.touched.clear()
        return views

    def claim(self, gpus_by_node: Mapping[str, tuple[int, ...]], count: int) -> None:
        """Take ``gpus_by_node`` (``count``: their number, which the caller has summed already);
        a wide job's start touches dozens of nodes."""
        mask, touched, known = self.mask, self.touched, self._bits
        with_free, pos = self.views.with_free, self.pos
        for node, idx in gpus_by_node.items():
            bits = known.get(idx) or self._bits_of(idx)
            if mask[node] & bits != bits:
                raise AssertionError(f"policy started a job on busy GPUs {idx} of {node}")
            mask[node] = left = mask[node] ^ bits
            if not left:
                with_free.pop(pos[node], None)
            touched[node] = None
        self.idle -= count
        self.views.free_gpus = self.idle

    def release(self, gpus_by_node: Mapping[str, tuple[int, ...]], count: int) -> None:
        """Give back ``gpus_by_node`` (``count``: their number)."""
        mask, touched, known = self.mask, self.touched, self._bits
        with_free, pos = self.views.with_free, self.pos
        for node, idx in gpus_by_node.items():
            mask[node] |= known.get(idx) or self._bits_of(idx)
            if mask[node]:
                with_free[pos[node]] = None
            touched[node] = None
        self.idle += count
        self.views.free_gpus = self.idle


def replay(
    jobs: Sequence[TraceJob],
    *,
    nodes: int,
    gpus_per_node: int,
    policy: types.Policy,
    config: PolicyConfig = REPLAY_CONFIG,
    shares: Mapping[str, float] | None = None,
    on_plan: Callable[[float, Plan], None] | None = None,
    declarations: Declarations = TODAY,
) -> list[Outcome]:
    """Replay ``jobs`` (sorted by submit time) on ``nodes`` x ``gpus_per_node``; outcomes in job order.

    ``policy`` runs at every distinct event time with jobs pending. Elastic starts run for
    ``run_s * requested / allocated`` (work conserved); preempted jobs requeue with the run time
    they had left (checkpointed) and the policy runs again at the same instant. A running job
    that outruns the run time it was planned with has it extended at that instant
    (``prediction.extended_s``), and the policy runs again.
    """
    jobs = declare(jobs, declarations)
    state = _Replay(
        jobs,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        config=config,
        declarations=declarations,
    )
    memo: types.ReleaseMemo = {}  # running jobs' releases, computed once per start
    nxt = 0
    while nxt < len(jobs) or state.finishes:
        now = min(
            jobs[nxt].submit_s if nxt < len(jobs) else math.inf, state.next_finish(), state.next_extension()
        )
        state.finish_until(now)
        state.extend_until(now)
        while nxt < len(jobs) and jobs[nxt].submit_s <= now:
            state.submit(nxt)
            nxt += 1
        for _ in range(8):  # preemptions free GPUs at once: plan again at the same instant
            if not state.pending or not (state.pool.idle or state.backlog_running):
                break  # nothing idle and nothing to preempt: no policy could start anything
            state.meter.now = now
            result = policy(
                now=now,
                nodes=state.pool.views_now(),
                running=state.by_end,
                pending=state.queue(),
                usage=state.meter,
                shares=shares or {},
                config=config,
                memo=memo,
            )
            if on_plan is not None:
                on_plan(now, result)
            state.promise(result.reservations)
            for s in result.starts:
                state.start(s.job_id, s.gpus_by_node, now)
            if not result.preemptions:
                break
            for jid in result.preemptions:
                state.preempt(jid, now)
    return state.outcomes


_end_key = attrgetter("expected_end", "job_id")
_submit_key = attrgetter("submitted_at", "job_id")


class _Replay:
    """The simulated world: queue, running jobs (kept in expected-end order), pool, meter, outcomes."""

    def __init__(
        self,
        jobs: Sequence[TraceJob],
        *,
        nodes: int,
        gpus_per_node: int,
        config: PolicyConfig,
        declarations: Declarations = TODAY,
    ) -> None:
        self.jobs = jobs
        self.config = config
        self.declarations = declarations
        self.history: dict[str, list[prediction.Finished]] = {}
        self.learned: dict[str, prediction.Learned] = {}
        self.extensions: list[tuple[float, int]] = []  # (planned end, job) of runs that will outrun it
        self.pool = _Pool(nodes=nodes, gpus_per_node=gpus_per_node)
        self.meter = UsageMeter(half_life_s=config.half_life_s)
        self.outcomes = [Outcome(job=j) for j in jobs]
        self.remaining = [j.run_s for j in jobs]
        self.pending: dict[int, PendingJob] = {}
        # The same queue in the same (insertion) order, kept across passes rather than rebuilt for each.
        self.waiting = types.PendingList()
        self.waiting.ready = self.waiting.ungated = True  # trace jobs neither stage nor wait for one another
        self.waiting.teams = self.queued_teams = Counter()
        self.waiting.sizes = self.queued_sizes = Counter()
        self.running: dict[int, RunningView] = {}
        self.by_end = types.RunningList()  # kept sorted: the policy need not sort it
        self.by_end.teams = self.running_teams = Counter()
        self.by_end.held = []
        self.by_submit = True  # whether ``pending`` (insertion order) is in submit order
        self.ends: dict[int, float] = {}
        self.finishes: list[tuple[float, int]] = []
        self.backlog_running = 0  # preemptible jobs holding GPUs
        self.largest = max((j.gpus for j in jobs), default=0)  # no queued job asks for more

    def next_finish(self) -> float:
        return self.finishes[0][0] if self.finishes else math.inf

    def next_extension(self) -> float:
        return self.extensions[0][0] if self.extensions else math.inf

    def planned_hours(self, j: TraceJob) -> float:
        """The run time the policy plans with: declared, learned for the team, or the true one."""
        estimates = self.declarations.estimates
        if estimates == "exact":
            return min(j.run_s / HOUR_S, j.declared_hours)
        if estimates == "learned":
            return self.learned.get(j.team, prediction.COLD).predict_hours(j.declared_hours)
        return j.declared_hours

    def promise(self, reservations: Sequence[types.Reservation]) -> None:
        """Remember each job's first reserved start: what a late prediction delays."""
        for r in reservations:
            out = self.outcomes[r.job_id]
            if r.start_at is not None and math.isnan(out.promised) and math.isnan(out.start):
                out.promised = r.start_at

    def queue(self) -> types.PendingList:
        """The pending jobs as the policy sees them, in submit order while that holds."""
        self.by_end.preemptible = self.backlog_running
        if not self.pending:
            self.by_submit = True
        self.waiting.by_submit, self.waiting.largest = self.by_submit, self.largest
        return self.waiting

    def submit(self, index: int, *, preemptible: bool | None = None) -> None:
        j = self.jobs[index]
        if self.pending and self.by_submit:
            last = self.waiting[-1]
            self.by_submit = (last.submitted_at, last.job_id) < (j.submit_s, index)
        self.pending[index] = job = PendingJob(
            index,
            j.team,
            j.gpus,
            self.planned_hours(j),
            j.submit_s,
            min_gpus=j.min_gpus,
            max_gpus=j.max_gpus,
            preemptible=j.preemptible if preemptible is None else preemptible,
            # a learned prediction never ranks the job: its declaration does (``types.ranked_hours``)
            limit_hours=j.declared_hours if self.declarations.estimates == "learned" else None,
        )
        priority.remember_terms(
            job, self.config
        )  # it stays this object while it waits: ranked without them again
        self.waiting.append(job)
        self.queued_teams[job.team] += 1
        self.queued_sizes[job.gpus] += 1

    def start(self, jid: int, gpus_by_node: Mapping[str, tuple[int, ...]], now: float) -> None:
        job = self.pending.pop(jid)
        self._unqueue(job)
        _count_out(self.queued_teams, job.team)
        _count_out(self.queued_sizes, job.gpus)
        self.running_teams[job.team] += 1
        got = types.gpus_held(gpus_by_node)
        self.pool.claim(gpus_by_node, got)
        run = (
            self.remaining[jid] * job.gpus / got
        )  # elastic: fewer GPUs, proportionally longer (more: shorter)
        rv = RunningView(
            jid, job.team, dict(gpus_by_node), now, now + job.hours * HOUR_S, job.preemptible,
            checkpoints=self.jobs[jid].checkpoints,
        )  # fmt: skip
        self.running[jid] = rv
        self.backlog_running += rv.preemptible
        self._file(rv, got)
        self.ends[jid] = now + run
        heapq.heappush(self.finishes, (now + run, jid))
        if rv.expected_end < now + run:
            heapq.heappush(self.extensions, (rv.expected_end, jid))
        self.meter.change(job.team, now, got)
        out = self.outcomes[jid]
        if math.isnan(out.start):
            out.start = now

    def _file(self, rv: RunningView, gpus: int) -> None:
        """Put a running job in ``by_end``, in expected-end order, with the GPUs it holds beside it."""
        i = bisect_right(self.by_end, _end_key(rv), key=_end_key)
        self.by_end.insert(i, rv)
        self.by_end.held.insert(i, gpus)

    def _unfile(self, rv: RunningView) -> None:
        """Take a running job, and its GPU count, out of ``by_end``."""
        i = bisect_left(self.by_end, _end_key(rv), key=_end_key)
        del self.by_end[i], self.by_end.held[i]

    def _unqueue(self, job: PendingJob) -> None:
        """Take a starting job out of ``waiting``: found by bisection while it is in submit order."""
        waiting = self.waiting
        if self.by_submit:
            i = bisect_left(waiting, _submit_key(job), key=_submit_key)
        else:
            i = next(i for i, queued in enumerate(waiting) if queued is job)
        if waiting[i] is not job:  # the queue was not in the order it claimed: never drop another job
            raise AssertionError(f"job {job.job_id} is not where its submit order puts it")
        del waiting[i]

    def finish_until(self, now: float) -> None:
        while self.finishes and self.finishes[0][0] <= now:
            end, jid = heapq.heappop(self.finishes)
            if self.ends.get(jid) == end:  # else a stale entry of a preempted run
                self._stop(jid, now)
                self._learn(self.jobs[jid])

    def _learn(self, j: TraceJob) -> None:
        if self.declarations.estimates != "learned":
            return
        history = self.history.setdefault(j.team, [])
        history.append(prediction.Finished(run_s=j.run_s, declared_hours=j.declared_hours))
        if len(history) > 2 * prediction.WINDOW:
            del history[: -prediction.WINDOW]
        self.learned[j.team] = prediction.learn(history, min_jobs=self.declarations.min_jobs)

    def extend_until(self, now: float) -> None:
        """Running jobs past the end they were planned with get a longer one, never past their limit."""
        while self.extensions and self.extensions[0][0] <= now:
            planned_end, jid = heapq.heappop(self.extensions)
            rv = self.running.get(jid)
            if rv is None or rv.expected_end != planned_end:
                continue  # finished or preempted since
            got = types.gpus_held(rv.gpus_by_node)
            j = self.jobs[jid]
            limit_s = j.declared_hours * HOUR_S * j.gpus / got  # an elastic start stretches the limit too
            planned = prediction.extended_s(
                planned_end - rv.started_at, elapsed_s=now - rv.started_at, limit_s=limit_s
            )
            if rv.started_at + planned <= planned_end:
                continue  # already at its limit
            self._unfile(rv)
            longer = RunningView(
                jid, rv.team, rv.gpus_by_node, rv.started_at, rv.started_at + planned, rv.preemptible,
                checkpoints=rv.checkpoints,
            )  # fmt: skip
            self.running[jid] = longer
            self._file(longer, got)
            if longer.expected_end < self.ends[jid]:
                heapq.heappush(self.extensions, (longer.expected_end, jid))

    def _stop(self, jid: int, now: float) -> RunningView:
        rv = self.running.pop(jid)
        self.backlog_running -= rv.preemptible
        _count_out(self.running_teams, rv.team)
        self._unfile(rv)
        del self.ends[jid]
        got = types.gpus_held(rv.gpus_by_node)
        self.pool.release(rv.gpus_by_node, got)
        self.meter.change(rv.team, now, -got)
        self.outcomes[jid].end = now
        self.outcomes[jid].gpu_seconds += got * (now - rv.started_at)
        return rv

    def preempt(self, jid: int, now: float) -> None:
        """Stop a backlog job and requeue it with the work it had left: all of it without checkpoints,
        else what came after its last checkpoint, plus the time to restore."""
        rv = self._stop(jid, now)
        job = self.jobs[jid]
        got = types.gpus_held(rv.gpus_by_node)
        done = (now - rv.started_at) * got / job.gpus  # work done, in seconds at the declared width
        kept, restore = 0.0, 0.0
        if job.checkpoints:
            interval = self.declarations.checkpoint_interval_s
            kept = done if interval <= 0 else math.floor(done / interval) * interval
            restore = self.declarations.restore_s if kept > 0 else 0.0
        self.remaining[jid] = max(self.remaining[jid] - kept + restore, 1.0)
        self.outcomes[jid].lost_gpu_seconds += (done - kept + restore) * job.gpus
        self.submit(jid, preemptible=True)


def _count_out(counts: Counter, key: str | int) -> None:
    """One job of ``key`` (a team, a size) fewer: a key with none left is no longer present."""
    counts[key] -= 1
    if not counts[key]:
        del counts[key]


# --------------------------------------------------------------------------- metrics


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(math.ceil(p / 100.0 * len(sorted_values)), 1)
    return float(sorted_values[rank - 1])


def bounded_slowdown(wait: float, run: float) -> float:
    return max((wait + run) / max(run, 10.0), 1.0)


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one value holds everything."""
    square_sum = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * square_sum) if square_sum else 1.0


def summarize(outcomes: Sequence[Outcome], *, pool_gpus: int) -> dict:
    """The JSON metrics of one policy's replay (definitions in the module docstring of the CLI)."""
    waits = [o.start - o.job.submit_s for o in outcomes]
    bslds = [bounded_slowdown(w, o.job.run_s) for w, o in zip(waits, outcomes, strict=True)]
    first_submit = min(o.job.submit_s for o in outcomes)
    makespan = max(o.end for o in outcomes) - first_submit
    used = sum(o.gpu_seconds for o in outcomes)
    last = max(outcomes, key=lambda o: (o.job.submit_s, o.job.run_s)).job
    bound = max(
        sum(o.job.run_s * o.job.gpus for o in outcomes) / pool_gpus, last.submit_s + last.run_s - first_submit
    )
    by_team: dict[str, list[float]] = {}
    for b, o in zip(bslds, outcomes, strict=True):
        by_team.setdefault(o.job.team, []).append(b)
    ordered = sorted(waits)
    return {
        "mean_wait_s": round(sum(waits) / len(waits), 1),
        "p95_wait_s": round(percentile(ordered, 95), 1),
        "p99_wait_s": round(percentile(ordered, 99), 1),
        "max_wait_s": round(ordered[-1], 1),
        "mean_bsld": round(sum(bslds) / len(bslds), 3),
        "bsld_cv": round(statistics.pstdev(bslds) / statistics.fmean(bslds), 4),
        "utilization": round(used / (pool_gpus * makespan), 4),
        "makespan_ratio": round(makespan / bound, 4),
        "jain_teams": round(jain([sum(v) / len(v) for v in by_team.values()]), 4),
        "by_size": _by_size(waits, outcomes),
        "reservations": reservation_delays(outcomes),
        "lost_gpu_hours": round(sum(o.lost_gpu_seconds for o in outcomes) / HOUR_S, 2),
    }


def reservation_delays(outcomes: Sequence[Outcome]) -> dict:
    """Jobs that were reserved, how many started after their first reserved start, and by how much.

    Declared limits are upper bounds, so a reservation made from them is kept or beaten; one made
    from predictions that fell short is late by as long as the running jobs outran them.
    """
    delays = [o.start - o.promised for o in outcomes if not math.isnan(o.promised)]
    late = [d for d in delays if d > 1e-6]
    return {
        "reserved": len(delays),
        "late": len(late),
        "mean_delay_s": round(sum(late) / len(late), 1) if late else 0.0,
        "max_delay_s": round(max(late), 1) if late else 0.0,
    }


def _by_size(waits: Sequence[float], outcomes: Sequence[Outcome]) -> dict:
    out = {}
    for label, lo, hi in SIZE_CLASSES:
        w = sorted(wt for wt, o in zip(waits, outcomes, strict=True) if lo <= o.job.gpus <= hi)
        out[label] = {
            "jobs": len(w),
            "mean_wait_s": round(sum(w) / len(w), 1) if w else 0.0,
            "p99_wait_s": round(percentile(w, 99), 1),
        }
    return out


# --------------------------------------------------------------------------- command line


def size_pool(jobs: Sequence[TraceJob], *, load: float, gpus_per_node: int) -> tuple[int, str]:
    """Whole nodes so that offered load = GPU-seconds / (pool GPUs x submit span) is about ``load``."""
    work = sum(j.run_s * j.gpus for j in jobs)
    span = max(jobs[-1].submit_s - jobs[0].submit_s, 1.0)
    nodes = max(round(work / (load * span) / gpus_per_node), 1)
    needed = math.ceil(max(j.gpus for j in jobs) / gpus_per_node)
    note = ""
    if nodes < needed:
        note = f" (raised from {nodes} nodes so that the largest job fits)"
        nodes = needed
    actual = work / (nodes * gpus_per_node * span)
    return (
        nodes,
        f"pool sized for offered load {load:g}: {nodes} nodes x {gpus_per_node} GPUs, actual load {actual:.3f}{note}",
    )


def headline(policies: Mapping[str, dict]) -> dict[str, str]:
    """The default policy against each EASY baseline present, as one sentence the pages show."""
    ours = policies.get("default")
    parts = []
    for base in ("easy", "easy-nodes"):
        if ours and base in policies and policies[base]["mean_bsld"]:
            change = 100.0 * (ours["mean_bsld"] / policies[base]["mean_bsld"] - 1.0)
            parts.append(f"{change:+.1f} % against {LABELS[base]} ({policies[base]['mean_bsld']:.2f})")
    if not parts:
        return {}
    return {"headline": f"default policy mean bounded slowdown {ours['mean_bsld']:.2f}: " + "; ".join(parts)}


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m jobs.scheduling.simulate", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--trace", required=True, help="SWF (.swf, .swf.gz) or ITP CSV file")
    ap.add_argument("--nodes", type=int, help="pool size in nodes (default: the SWF header's machine)")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--load", type=float, help="size the pool for this offered load instead")
    ap.add_argument("--policies", default="default,easy-nodes,easy,sjf-easy,fcfs")
    ap.add_argument("--json", action="store_true", help="(the JSON summary is always the last line)")
    ap.add_argument("--plot", help="write an SVG chart here")
    ap.add_argument("--limit", type=int, help="replay only the first N jobs")
    ap.add_argument("--procs-per-gpu", type=int, default=1, help="SWF: processors per GPU (default 1)")
    ap.add_argument("--itp-overestimate", type=float, default=1.0, help="ITP: declared = duration x this")
    ap.add_argument(
        "--estimates", choices=ESTIMATES, default="declared",
        help="run times the policy plans with: declared hours, learned per team, or the true ones",
    )  # fmt: skip
    return ap.parse_args(argv)


def choose_pool(
    trace: traces.Trace,
    jobs: Sequence[TraceJob],
    *,
    gpus_per_node: int,
    load: float | None = None,
    nodes: int | None = None,
) -> tuple[int, str]:
    """Nodes of the pool, and how they were chosen: sized for an offered ``load``, ``nodes`` as
    given, or the SWF trace's own machine."""
    g = gpus_per_node
    if load:
        return size_pool(jobs, load=load, gpus_per_node=g)
    if nodes:
        return nodes, f"pool: {nodes} nodes x {g} GPUs (given)"
    if trace.machine_gpus:
        nodes = trace.machine_gpus // g
        return nodes, f"pool: the trace's machine, {trace.machine_gpus} GPUs = {nodes} nodes x {g} GPUs"
    raise SystemExit("no pool size: pass --nodes or --load (the trace does not name its machine)")


def largest_class(metrics: Mapping) -> str:
    """The largest size class with jobs in ``summarize``'s figures."""
    return [label for label, _, _ in SIZE_CLASSES if metrics["by_size"][label]["jobs"]][-1]


def fight_figures(metrics: Mapping) -> dict:
    """What a fair fight compares per policy (``summarize``'s figures): mean bounded slowdown, the
    p99 wait of the largest size class present, Jain's index over teams and the spread of slowdowns
    it follows, utilisation."""
    largest = largest_class(metrics)
    return {
        "mean_bsld": metrics["mean_bsld"],
        "p99_wait_largest_s": metrics["by_size"][largest]["p99_wait_s"],
        "largest_class": largest,
        "jain_teams": metrics["jain_teams"],
        "bsld_cv": metrics["bsld_cv"],
        "utilization": metrics["utilization"],
    }


def main(argv: Sequence[str] | None = None) -> dict:
    args = _parse_args(argv)
    trace = traces.read_trace(
        args.trace, procs_per_gpu=args.procs_per_gpu, itp_overestimate=args.itp_overestimate
    )
    jobs = trace.jobs[: args.limit] if args.limit else trace.jobs
    for note in trace.notes:
        print(note)
    nodes, note = choose_pool(trace, jobs, gpus_per_node=args.gpus_per_node, load=args.load, nodes=args.nodes)
    print(note)
    pool_gpus = nodes * args.gpus_per_node
    kept = [j for j in jobs if j.gpus <= pool_gpus]
    print(
        f"dropped {len(jobs) - len(kept)} jobs larger than the pool ({pool_gpus} GPUs); replaying {len(kept)}"
    )
    summary: dict = {"trace": trace.name, "jobs": len(kept), "pool_gpus": pool_gpus, "policies": {}}
    replays = {}
    for name in [p.strip() for p in args.policies.split(",") if p.strip()]:
        began = time.perf_counter()
        outcomes = replay(
            kept, nodes=nodes, gpus_per_node=args.gpus_per_node, policy=POLICIES[name],
            declarations=Declarations(estimates=args.estimates),
        )  # fmt: skip
        wall = time.perf_counter() - began
        metrics = summarize(outcomes, pool_gpus=pool_gpus)
        metrics["wall_s"] = round(wall, 1)
        metrics["label"] = LABELS[name]
        summary["policies"][name] = metrics
        replays[name] = outcomes
        print(
            f"{name}: mean wait {metrics['mean_wait_s']:.0f} s, mean bsld {metrics['mean_bsld']:.2f}, "
            f"utilisation {metrics['utilization']:.3f}, jain {metrics['jain_teams']:.3f}, replay {wall:.1f} s",
            flush=True,
        )
    summary.update(headline(summary["policies"]))
    if args.plot:
        plot.write_svg(args.plot, summary=summary, replays=replays, pool_gpus=pool_gpus)
        print(f"wrote {args.plot}")
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
