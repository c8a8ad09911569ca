"""Jobs held back by facts the pool does not decide: prerequisites still to end, an array at its limit.

Pure core: the caller states the facts (``PendingJob.waits_for``, ``array``/``array_limit``,
``RunningView.array``). ``split`` runs before ranking, so a held job is never ranked, placed,
reserved for or counted as starved; ``estimates`` runs after the pass and tells each held job
when it should start and why not sooner, from the pass's own estimates and the running jobs' ends,
and for a job waiting for prerequisites, from the pass's placement of it as ready once they end.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import repeat
from operator import attrgetter, is_not

from jobs.scheduling.explanation import format_utc
from jobs.scheduling.types import HOUR_S, Estimate, PendingJob, PendingList, RunningView


@dataclass(frozen=True, slots=True)
class Split:
    ready: list[PendingJob]  # in the caller's order; may be the caller's own list: read it, never change it
    waiting: list[PendingJob]  # prerequisites left
    throttled: list[PendingJob]  # their array already runs (or is about to run) its limit


def split(pending: Sequence[PendingJob], running: Sequence[RunningView], *, now: float) -> Split:
    """Lets through every job without prerequisites left, and of each array only as many tasks as its
    limit leaves room for beside the tasks running now: ready tasks first, then those still staging,
    lowest ids first within each."""
    if (isinstance(pending, PendingList) and pending.ungated) or not (
        any(map(_waits_for, pending)) or any(map(is_not, map(_array_limit, pending), repeat(None)))
    ):
        # Nothing held (C-level checks only): the caller's own list, with the facts a keeper keeps on it.
        return Split(
            ready=pending if isinstance(pending, PendingList) else list(pending), waiting=[], throttled=[]
        )
    room: Counter[int] = Counter()
    for r in running:
        if r.array is not None:
            room[r.array] -= 1
    waiting, throttled, blocked = [], [], set()
    for job in _slot_order(pending, now):
        if job.waits_for:
            waiting.append(job)
            blocked.add(job.job_id)
        elif job.array is not None and job.array_limit is not None:
            if job.array_limit + room[job.array] <= 0:
                throttled.append(job)
                blocked.add(job.job_id)
            else:
                room[job.array] -= 1
    ready = [job for job in pending if job.job_id not in blocked] if blocked else list(pending)
    return Split(ready=ready, waiting=waiting, throttled=throttled)


def _slot_order(pending: Sequence[PendingJob], now: float) -> list[PendingJob]:
    """Ready jobs, then those still staging; lowest ids first within each.

    A task still staging holds no GPU and could not take one now: given its array's slot before a ready
    sibling, it would keep that sibling off an idle pool for as long as its data takes to arrive.
    """
    by_id = sorted(pending, key=_job_id)
    if not any(map(_ready_at, by_id)):  # nothing staging (C-level check): the common case, and every replay
        return by_id
    staging = [job for job in by_id if job.ready_at is not None and job.ready_at > now]
    if not staging:
        return by_id
    later = set(map(_job_id, staging))
    return [job for job in by_id if job.job_id not in later] + staging


_job_id = attrgetter("job_id")
_ready_at = attrgetter("ready_at")
_waits_for = attrgetter("waits_for")
_array_limit = attrgetter("array_limit")


def estimates(
    *,
    now: float,
    gate: Split,
    running: Sequence[RunningView],
    planned: Mapping[int, Estimate],
    place: Callable[[Sequence[PendingJob]], dict[int, Estimate]],
) -> dict[int, Estimate]:
    """An estimate for every held job: throttled tasks first (they follow their array's waves),
    then jobs waiting for prerequisites (whose ends may be any other estimate, held ones included).

    ``place`` is the pass's own placement, asked after it decided (``placement.Afterwards.estimate``): a
    waiting job is ready no earlier than its last prerequisite's end, plus its staging (which begins only
    then), and starts when GPUs it can use are free from that time; one the pool could never place is told so.
    """
    out = _throttled(now=now, gate=gate, running=running, planned=planned)
    if gate.waiting:
        known = {**planned, **out}
        out.update(_Waits(now=now, gate=gate, running=running, known=known).estimates(place))
    return out


def _throttled(
    *, now: float, gate: Split, running: Sequence[RunningView], planned: Mapping[int, Estimate]
) -> dict[int, Estimate]:
    """A held task starts as a slot of its array frees: the i-th held task takes the i-th slot to
    end (running tasks by their declared ends, this pass's by their estimates), wave after wave;
    not before its data is in place, where it is still staging."""
    slots: dict[int, list[float]] = defaultdict(list)
    active: Counter[int] = Counter()
    for r in running:
        if r.array is not None:
            slots[r.array].append(r.expected_end)
            active[r.array] += 1
    for job in gate.ready:
        estimate = planned.get(job.job_id)
        if job.array is None or job.array_limit is None or estimate is None:
            continue
        if estimate.start_at is not None:
            slots[job.array].append(estimate.start_at + job.hours * HOUR_S)
        active[job.array] += estimate.start_at == now
    out: dict[int, Estimate] = {}
    position: Counter[int] = Counter()
    for job in gate.throttled:
        a, i = job.array, position[job.array]
        position[a] += 1
        ends = sorted(slots[a])
        start = ends[i % len(ends)] + (i // len(ends)) * job.hours * HOUR_S if ends else None
        running_now = active[a]
        detail = (
            f"{running_now} {'is' if running_now == 1 else 'are'} running"
            if running_now >= job.array_limit
            else f"{running_now} running, {job.array_limit - running_now} next in line"
        )
        limit = f"{job.array_limit} task{'s' if job.array_limit != 1 else ''}"
        reason = f"array {a} runs at most {limit} at once: {detail}"
        if start is not None:
            start = max(start, now)
            if job.ready_at is not None and job.ready_at > start:  # its data arrives after its slot frees
                start = job.ready_at
                reason += f"; its data is still staging (ETA {format_utc(job.ready_at, now=now)})"
        out[job.job_id] = Estimate(job.job_id, start, "array_limit", reason)
    return out


class _Waits:
    """Estimates for jobs waiting for prerequisites: when each prerequisite should end (running ones by their
    planned ends, others by their estimated start + hours, waiting ones once estimated themselves), and from
    that, through the pass's placement, when each waiting job could start."""

    def __init__(
        self, *, now: float, gate: Split, running: Sequence[RunningView], known: Mapping[int, Estimate]
    ) -> None:
        self.now = now
        self.end: dict[int, float | None] = {r.job_id: r.expected_end for r in running}
        for job in (*gate.ready, *gate.throttled):
            estimate = known.get(job.job_id)
            if estimate is not None:
                self.end[job.job_id] = _end_of(job, estimate)
        self.waiting = {job.job_id: job for job in gate.waiting}

    def estimates(self, place: Callable[[Sequence[PendingJob]], dict[int, Estimate]]) -> dict[int, Estimate]:
        """Level by level: jobs whose waiting prerequisites are all estimated, in one placement each (ids only grow,
        so a job's prerequisites are estimated before it; past PLACED_LEVELS, from its prerequisites alone)."""
        out: dict[int, Estimate] = {}
        depth: dict[int, int] = {}
        levels: defaultdict[int, list[PendingJob]] = defaultdict(list)
        unreachable = []
        for job in sorted(self.waiting.values(), key=_job_id):  # a prerequisite is older: its depth is known
            ahead = [p for p, _ in job.waits_for if p in self.waiting]
            if not all(
                p in depth for p in ahead
            ):  # a cycle: the database refuses one, but never loop for ever
                unreachable.append(job)
                continue
            depth[job.job_id] = d = 1 + max(map(depth.__getitem__, ahead), default=0)
            levels[d].append(job)
        for d in sorted(levels):
            out.update(self._level(levels[d], out, place if d <= PLACED_LEVELS else _by_prerequisites_alone))
        for job in unreachable:
            first, how = job.waits_for[0]
            out[job.job_id] = Estimate(job.job_id, None, "dependency", _waiting_sentence(job, first, how, ""))
        return out

    def _level(
        self,
        level: Sequence[PendingJob],
        out: dict[int, Estimate],
        place: Callable[[Sequence[PendingJob]], dict[int, Estimate]],
    ) -> dict[int, Estimate]:
        binding: dict[int, tuple[float | None, int, str]] = {}  # the last prerequisite to end, per job
        ready: list[PendingJob] = []
        for job in level:
            latest: tuple[float | None, int, str] | None = None
            for prerequisite, how in job.waits_for:
                end = self._end(prerequisite, out)
                if end is None:
                    latest = (None, prerequisite, how)
                    break
                if latest is None or end > latest[0]:
                    latest = (end, prerequisite, how)
            assert latest is not None  # a waiting job has at least one prerequisite left
            binding[job.job_id] = latest
            end = latest[0]
            at = self.now if end is None else max(end, self.now) + job.stage_s
            ready.append(replace(job, ready_at=max(at, job.ready_at or at)))
        # Ready first go first (ties by id), those whose prerequisite can never end last: each is counted behind
        # those before it in its level.
        ready.sort(key=lambda job: (binding[job.job_id][0] is None, job.ready_at, job.job_id))
        placed = place(ready)
        estimates: dict[int, Estimate] = {}
        for job in ready:
            end, prerequisite, how = binding[job.job_id]
            estimates[job.job_id] = self._estimate(job, placed[job.job_id], end, prerequisite, how)
        return estimates

    def _estimate(
        self, job: PendingJob, placed: Estimate, end: float | None, prerequisite: int, how: str
    ) -> Estimate:
        if placed.start_at is None:  # the pool can never place it, whatever its prerequisites do
            return Estimate(
                job.job_id,
                None,
                placed.reason_code,
                f"{placed.reason}; it also waits for job {prerequisite} to {how}",
            )
        if end is None:
            when = "it cannot be placed on this pool as it is"
            return Estimate(job.job_id, None, "dependency", _waiting_sentence(job, prerequisite, how, when))
        if prerequisite in self.end or prerequisite in self.waiting:
            when = f"expected to end by {format_utc(end, now=self.now)}"
        else:
            when = ""  # it has ended and is settling (its outputs being delivered)
        assert job.ready_at is not None  # set by ``_level``
        start = max(placed.start_at, job.ready_at, self.now)
        sentence = _waiting_sentence(job, prerequisite, how, when)
        if placed.reason == DEEP:
            sentence += f"; {DEEP}"
        after = max(end, self.now)
        if start > after:
            if job.ready_at > after:
                sentence += (
                    f"; its data is staged only then (ready about {format_utc(job.ready_at, now=self.now)})"
                )
            if start > job.ready_at:
                sentence += f"; the GPUs it needs are busy until about {format_utc(start, now=self.now)}"
        return Estimate(job.job_id, start, "dependency", sentence)

    def _end(self, job_id: int, out: Mapping[int, Estimate]) -> float | None:
        if job_id in self.end:
            return self.end[job_id]
        if job_id in self.waiting:  # a chain: estimated in an earlier level
            return _end_of(self.waiting[job_id], out[job_id])
        return self.now  # ended already, or finishing delivery: nothing of the pool's to wait for


# Levels of a dependency chain estimated by a placement each (every one rebuilds the pass's timeline): a team's chain
# of 2,000 jobs, each naming the one before, made every pass take 4.6-7.6 s instead of 68 ms under the pool-wide
# lock. Deeper levels are estimated from their prerequisites alone.
PLACED_LEVELS = 16
DEEP = f"estimated from its prerequisites alone, more than {PLACED_LEVELS} levels of them deep"


def _by_prerequisites_alone(jobs: Sequence[PendingJob]) -> dict[int, Estimate]:
    return {job.job_id: Estimate(job.job_id, job.ready_at, "dependency", DEEP) for job in jobs}


def _end_of(job: PendingJob, estimate: Estimate) -> float | None:
    return None if estimate.start_at is None else estimate.start_at + job.hours * HOUR_S


def _waiting_sentence(job: PendingJob, prerequisite: int, how: str, when: str) -> str:
    """Names the prerequisite that binds (the last to end), and when it should end if the pool knows."""
    sentence = f"waiting for job {prerequisite} to {how}" + (f" ({when})" if when else "")
    others = len(job.waits_for) - 1
    if others:
        sentence += f"; {others} other prerequisite{'s' if others > 1 else ''} left"
    return sentence
