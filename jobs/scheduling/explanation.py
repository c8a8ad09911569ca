"""Estimates and reasons: when each waiting job should start, and a sentence saying why it waits.

Read from one pass's working state after it has decided; never changes a decision. Pure core.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import TYPE_CHECKING

from jobs.scheduling.types import DAY_S, HOUR_S, Estimate, PendingJob, PolicyConfig
from jobs.units import format_size

if TYPE_CHECKING:  # the pass hands itself in; importing it at run time would be a cycle
    from jobs.scheduling.placement import Held, Outcome, Pass, _Kind
    from jobs.scheduling.priority import Ranking

# Why a node up in the pool takes no job for now (jobs.snapshot): an operator's drain, its agent gone silent, an
# agent upgrading or run on other code, a short hold after its disk could not hold an attempt.
PAUSES = "drained or draining, silent, upgrading, or briefly held after its disk was full"


def _first(pair: tuple) -> object:
    return pair[0]


def format_utc(ts: float, *, now: float | None = None) -> str:
    """``14:20 UTC``, with the day added when it is not the same UTC day as ``now``."""
    if ts % 60 > 60 - _ROUNDS_UP or (now is not None and now % DAY_S > DAY_S - _ROUNDS_UP):
        when = datetime.fromtimestamp(ts, UTC)  # datetime rounds these up into the next minute or day
        return _hh_mm(
            when, with_day=now is not None and when.date() != datetime.fromtimestamp(now, UTC).date()
        )
    return _format_minute(int(ts // 60), None if now is None else int(now // DAY_S))


# datetime keeps microseconds (rounding half to even): this close to a minute, it may show the next.
_ROUNDS_UP = 1e-6


@lru_cache(maxsize=4096)
def _format_minute(minute: int, today: int | None) -> str:
    """``format_utc`` by UTC minute and day (POSIX days are 86,400 s): a pass tells thousands of
    jobs about the same few minutes, and formatting a datetime costs more than the rest of a reason."""
    same_day = today is None or minute // 1440 == today
    return _hh_mm(datetime.fromtimestamp(minute * 60, UTC), with_day=not same_day)


def _hh_mm(when: datetime, *, with_day: bool) -> str:
    return f"{when:%H:%M} UTC on {when.day} {when:%b}" if with_day else f"{when:%H:%M} UTC"


def _describe_size(g: int, node_gpus: int) -> str:
    if g <= node_gpus:
        return f"needs {g} GPU{'s' if g != 1 else ''} on one node"
    whole, rest = divmod(g, node_gpus)
    extra = f" plus {rest} on another" if rest else ""
    return f"needs {g} GPUs: {_count(whole, 'whole node')}{extra}"


def _describe_job(job: PendingJob, node_gpus: int) -> str:
    """Its size, and for an elastic job the fewest GPUs it starts on."""
    size = _describe_size(job.gpus, node_gpus)
    if job.min_gpus is not None and job.min_gpus < job.gpus:
        return f"{size} (elastic, at least {job.min_gpus})"
    return size


# Profile segments one pass scans or books for blocked jobs: a few tens of milliseconds. Jobs past it (a queue
# thousands deep) are told when the idle GPU-seconds the booking leaves cover their work and the work of such jobs
# ranked ahead of them, as if nothing of theirs backfilled (``_Booking.book``).
BOOKING_STEPS = 100_000


class _Booking:
    """Idle GPUs of the pool over time, as the pass leaves them if nothing new is submitted: running jobs end when
    expected, this pass's starts hold their GPUs until theirs end, reservations from their start to their end.

    Used only for estimates. Each blocked job, in priority order, is booked at the first time as many GPUs as it
    starts on are idle for its hours (conservative backfilling, counted pool-wide): a job behind it may fill a gap
    before it, never delay it. That is how the policy starts small jobs around big ones. Counting every GPU-hour
    queued ahead instead, as if nothing backfilled, told a 1-GPU job of 20 minutes that it would wait 146 hours on
    an ITP trace; it started within 1.3. Where its GPUs are idle together is checked after (``_Ends.together``).
    """

    def __init__(self, p: Pass) -> None:
        now, cap = p.now, p.capacity
        changes: dict[float, int] = {}
        busy = 0

        def hold(gpus: int, start: float, end: float) -> None:
            nonlocal busy
            if start <= now:
                busy += gpus
            else:
                changes[start] = changes.get(start, 0) - gpus
            changes[end] = changes.get(end, 0) + gpus

        for (
            r
        ) in p.releases():  # backlog jobs' GPUs count as free for the first blocked job (``hold_backlog``)
            if r.expected_end > now:
                hold(sum(len(ix) for n, ix in r.gpus_by_node.items() if n in cap), now, r.expected_end)
        holds = Counter()
        for h in p.held:
            end = h.start_at + h.job.hours * HOUR_S
            hold(sum(h.need.values()), h.start_at, end)
            holds[end, tuple(sorted(h.need.items()))] += 1
        for end, counts in p.local_events:  # this pass's starts; its holds are booked above, from their start
            key = (end, tuple(sorted(counts.items())))
            if holds[key]:
                holds[key] -= 1
            elif end > now:
                hold(sum(counts.values()), now, end)
        self.times, self.free = [now], [p.total_gpus - busy]
        for t in sorted(changes):
            if t > now:
                self.times.append(t)
                self.free.append(self.free[-1] + changes[t])
        self.most = p.total_gpus
        self.steps = 0
        self._hint: dict[int, float] = {}  # per size: no fit starts before this (idle GPUs only ever fall)
        self._area: list[float] | None = None  # idle GPU-seconds from now to each step, once past the budget
        self._unbooked = 0.0
        self._backlog_held = False

    def book(self, g: int, seconds: float, earliest: float) -> float | None:
        """The first time at or after ``earliest`` that ``g`` GPUs are idle for ``seconds``, booked for them while
        the pass's budget lasts. None if the pool never has that many."""
        if g > self.most:
            return None
        if self.steps >= BOOKING_STEPS:
            return self._past_budget(g * seconds, earliest)
        times, free = self.times, self.free
        hint = self._hint.get(g, times[0])  # no fit of g starts before it; learnt only by a scan begun at it
        i = max(bisect_right(times, max(earliest, hint)) - 1, 0)
        start = first = None
        n = len(times)
        while i < n:
            self.steps += 1
            if self.steps >= BOOKING_STEPS:
                return self._past_budget(g * seconds, earliest)
            if free[i] >= g:
                if first is None:
                    first = times[i]
                if start is None:
                    start = max(times[i], earliest)
                if i + 1 == n or times[i + 1] >= start + seconds:
                    break
            else:
                start = None
            i += 1
        if start is None:  # past the last change the whole pool is idle: never the case unless g > most
            return None
        if first is not None and earliest <= hint:
            self._hint[g] = first
        if seconds > 0:
            self._take(g, start, start + seconds)
        return start

    def _past_budget(self, work: float, earliest: float) -> float:
        """When the idle GPU-seconds left after every booking cover the work of the jobs past the budget so far,
        this one's included."""
        if self._area is None:
            self._area, level = [0.0], 0.0
            for i in range(1, len(self.times)):
                level += max(self.free[i - 1], 0) * (self.times[i] - self.times[i - 1])
                self._area.append(level)
        self._unbooked += work
        area, times = self._area, self.times
        i = max(bisect_right(area, self._unbooked) - 1, 0)  # the last step whose area so far is <= the work
        rate = max(self.free[i], 0)
        done = times[i] + (self._unbooked - area[i]) / rate if rate else times[min(i + 1, len(times) - 1)]
        return max(done, earliest)

    def hold_backlog(self, p: Pass) -> None:
        """Running backlog jobs hold their GPUs to their end for the jobs booked from now on: only the next
        reservation (the first blocked job's) preempts them, and a waiting backlog job never does. Once."""
        if self._backlog_held:
            return
        self._backlog_held = True
        for r in p.running:
            if r.preemptible and r.expected_end > p.now and r.job_id not in p.preempted:
                gpus = sum(len(ix) for n, ix in r.gpus_by_node.items() if n in p.capacity)
                if self._area is None:
                    self._take(gpus, p.now, r.expected_end)
                else:  # past the budget: their work comes before the backlog's like any job's past it
                    self._unbooked += gpus * (r.expected_end - p.now)

    def _take(self, g: int, start: float, end: float) -> None:
        a, b = self._split(start), self._split(end)
        free = self.free
        for k in range(a, b):
            free[k] -= g
        self.steps += b - a

    def _split(self, t: float) -> int:
        """The index of the segment starting at ``t``, splitting the one it falls in."""
        times = self.times
        i = bisect_left(times, t)
        if i == len(times) or times[i] != t:
            times.insert(i, t)
            self.free.insert(i, self.free[i - 1])
        return i


@dataclass(frozen=True, slots=True)
class _Head:
    """The first job ranked ahead of the rest that does not start now, and when it is expected to."""

    job: PendingJob
    start_at: float | None


class Explainer:
    """Estimates and reasons for a pass; subclassed by the default policy to name fair share."""

    def estimates(self, p: Pass, order: Sequence[PendingJob], outcome: Outcome) -> dict[int, Estimate]:
        out: dict[int, Estimate] = {}
        booking: _Booking | None = None
        head: _Head | None = None  # the first job ranked ahead that is not starting now
        backlog: list[PendingJob] = []
        ends = _Ends(p, order, outcome)
        for job in order:
            jid = job.job_id
            if jid in outcome.never:
                out[jid] = self._never(p, job)
            elif jid in outcome.started:
                out[jid] = self._started(p, job, outcome.started[jid])
            elif jid in outcome.held:
                out[jid] = self._held(p, outcome.held[jid], ends)
                head = head or _Head(job, out[jid].start_at)
            elif job.preemptible:
                backlog.append(job)  # it yields to every other job: estimated after all of them
            else:
                # The first blocked job gets the next reservation, which may preempt backlog jobs, as soon as the
                # holds ahead of it start: if all start now. No other waiting job may preempt them.
                first = booking is None and all(h.start_at <= p.now for h in p.held)
                booking = booking or _Booking(p)
                out[jid] = self._blocked(p, job, booking, head, ends, soft_free=first)
                booking.hold_backlog(p)
                head = head or _Head(job, out[jid].start_at)
        booking = booking or _Booking(p)
        booking.hold_backlog(p)
        for job in backlog:
            out[job.job_id] = self._blocked(p, job, booking, head, ends, soft_free=False)
        return out

    def _never(self, p: Pass, job: PendingJob) -> Estimate:
        """Why the pool can never place ``job``: its GPU model where that is why (``_model_never``), else its disk,
        memory or CPUs, judged on the nodes of its shape (its GPU model's where it names one), or its GPUs, judged on
        the whole pool."""
        g, s = job.min_gpus or job.gpus, p.kind(job)
        if s is not p:
            told = _model_never(p, job, g, s)
            if told is not None:
                return told
        if not p.capacity:
            reason = "no node in the pool is taking jobs now (all draining, drained, down or mid-upgrade)"
            return Estimate(job.job_id, None, "no_nodes", reason)
        if job.space > p.largest_disk and p.ever_fits(g, s):
            return _space_never(p, job)
        if p.ever_fits(g, s) and not p.ever_has_room(job, g, s):
            return _room_never(p, job, g, s)
        now_has = (
            f"the schedulable pool has {_count(p.total_gpus, 'GPU')} on {_count(len(p.capacity), 'node')} "
            f"of up to {_count(p.node_gpus, 'GPU')}"
        )
        if g > p.node_gpus and p.no_span and _fits_if_all_span(p, g):
            return _span_never(p, job, g)
        paused_nodes, paused_gpus = p.paused
        if paused_nodes and g <= p.total_gpus + paused_gpus:  # the drain is temporary: so is this wait
            one = paused_nodes == 1
            reason = (
                f"cannot be placed while {_count(paused_nodes, 'node')} {'is' if one else 'are'} not taking jobs "
                f"({PAUSES}: a pause, not a limit): needs {_count(g, 'GPU')}, {now_has}; it waits until "
                f"{'it takes' if one else 'they take'} jobs again"
            )
            return Estimate(job.job_id, None, "drained_capacity", reason)
        reason = f"larger than the pool can ever place: needs {g} GPUs, {now_has}"
        return Estimate(job.job_id, None, "too_large", reason)

    def _started(self, p: Pass, job: PendingJob, got: int) -> Estimate:
        if got < job.gpus:
            reason = (
                f"starting now with {got} of {job.gpus} GPUs (elastic, at least {job.min_gpus}), "
                "sooner than waiting for all of them"
            )
            return Estimate(job.job_id, p.now, "starting_smaller", reason)
        return Estimate(job.job_id, p.now, "starting", "starting now")

    def _held(self, p: Pass, hold: Held, ends: _Ends) -> Estimate:
        job = hold.job
        where = _node_list(hold.need)
        size = _describe_job(job, p.kind(job).node_gpus)
        if hold.start_at <= p.now and job.job_id in p.preempt_ready:
            stopped = p.preempted_by(hold)
            reason = (
                f"{size}; starting on {where} as soon as the backlog jobs there are preempted and requeued"
            )
            if stopped > p.now:
                reason += (
                    f": they have up to {_minutes(stopped - p.now)} to stop (a checkpoint's grace, or the kill "
                    f"grace), so about {format_utc(stopped, now=p.now)}"
                )
            return Estimate(job.job_id, stopped, "preempting", reason)
        if hold.start_at <= p.now and p.held_back_by_room(job):
            frees = ends.room_frees(job)
            if frees is None:
                return _no_room_unknown(job, size)
            reason = (
                f"{size}; its GPUs are idle, but no node has its memory and CPUs free yet; it starts when "
                f"running jobs there end, the first about {format_utc(frees, now=p.now)}"
            )
            return Estimate(job.job_id, frees, "no_room", reason)
        starved = ""
        if self.is_starved(job):
            starved = "waited past the starvation bound, so it holds a reservation: "
        reserved = f"reserved on {where} from {format_utc(hold.start_at, now=p.now)}"
        smaller = ends.minimum_frees(hold) if job.min_gpus is not None and job.min_gpus < job.gpus else None
        if smaller is not None and smaller < hold.start_at:
            # The reservation is for all its GPUs; the pass starts it on fewer as soon as its minimum is free.
            reason = (
                f"{starved}{size}; expected to start about {format_utc(smaller, now=p.now)} on fewer GPUs, when "
                f"{job.min_gpus} are free together, rather than wait for all {job.gpus}: they are {reserved}"
            )
            return Estimate(job.job_id, smaller, "elastic", reason)
        return Estimate(job.job_id, hold.start_at, "reserved", f"{starved}{size}; {reserved}")

    def is_starved(self, job: PendingJob) -> bool:
        return False

    def _blocked(
        self,
        p: Pass,
        job: PendingJob,
        booking: _Booking,
        head: _Head | None,
        ends: _Ends,
        *,
        soft_free: bool,
    ) -> Estimate:
        """Booked after the jobs ranked ahead of it; told it waits behind ``head`` only if it starts after it (one
        that backfills a gap before it waits for GPUs to free, not for it). ``soft_free``: it may count on backlog
        jobs' GPUs (it is next in line for a reservation, which preempts them)."""
        s = p.kind(job)
        earliest = p.now if job.ready_at is None else max(p.now, job.ready_at)
        at = booking.book(_fewest(job, s.node_gpus), job.hours * HOUR_S, earliest)
        at = earliest if at is None else at
        if job.ready_at is not None and job.ready_at > p.now:
            at, when = _expected(p, s, job, at, ends, soft_free=soft_free)
            eta = format_utc(job.ready_at, now=p.now)
            return Estimate(
                job.job_id, at, "staging", f"waiting for its data to finish staging (ETA {eta}); {when}"
            )
        size = _describe_job(job, s.node_gpus)
        no_room = p.held_back_by_room(job)
        if no_room:  # idle GPUs do not start it: memory and CPUs free only as jobs on its nodes end
            frees = ends.room_frees(job)
            if frees is None:
                return _no_room_unknown(job, size)
            at = max(at, frees)
        at, when = _expected(p, s, job, at, ends, soft_free=soft_free)
        if job.preemptible:
            reason = f"backlog job: runs on GPUs nobody else wants, after every other waiting job; {when}"
            return Estimate(job.job_id, at, "backlog", reason)
        if no_room:
            reason = f"{size}; its GPUs are idle, but no node has its memory and CPUs free yet; {when}"
            return Estimate(job.job_id, at, "no_room", reason)
        if head is None or (head.start_at is not None and at < head.start_at):
            return Estimate(job.job_id, at, "no_gpus", f"{size}; not enough idle GPUs yet; {when}")
        behind = self.behind(job, head.job)
        if behind:
            return Estimate(job.job_id, at, "fairshare", f"{behind}; {size}; {when}")
        ahead = head.job
        if ahead.team != job.team:  # nothing of another team's job is told: not its id, team or size
            return Estimate(job.job_id, at, "queued", f"{size}; waiting behind another team's job; {when}")
        reason = f"{size}; waiting behind job {ahead.job_id} (higher priority, {_count(ahead.gpus, 'GPU')}); {when}"
        return Estimate(job.job_id, at, "queued", reason)

    def behind(self, job: PendingJob, head: PendingJob) -> str:
        return ""


def _expected(
    p: Pass, s: Pass | _Kind, job: PendingJob, at: float, ends: _Ends, *, soft_free: bool
) -> tuple[float, str]:
    """When a blocked job is expected to start, and the clause saying so: ``at``, or later where the GPUs it can
    use (of the GPU model it asked for, its shape ``s``, where it names one) are not idle together until then, on
    one node or on the whole nodes a job spanning nodes takes. Counted pool-wide, 16 idle GPUs four to a node
    would have told an 8-GPU job it starts now. A job that would end before the first reservation may use the
    reserved GPUs until then, as the pass lets it; one running past it only GPUs no reservation counts on."""
    g, seconds, first_hold = _fewest(job, s.node_gpus), job.hours * HOUR_S, p.first_reservation
    together = (
        ends.together(s, g, before_holds=True, soft_free=soft_free) if at + seconds <= first_hold else None
    )
    if together is None or together + seconds > first_hold:
        together = ends.together(s, g, before_holds=False, soft_free=soft_free)
    if together is not None and together > at:
        if s is not p:
            why = f"the {s.model} GPUs it asked for are busy until then"
        elif g <= s.node_gpus:
            why = f"when {_count(g, 'GPU')} are first idle together on one node"
        else:
            whole, rest = divmod(g, s.node_gpus)
            more = f" and {rest} GPUs on another" if rest else ""
            why = f"when {_count(whole, 'whole node')}{more} are first idle together"
        return together, f"expected to start about {format_utc(together, now=p.now)} ({why})"
    return at, f"expected to start about {format_utc(at, now=p.now)}"


def _fewest(job: PendingJob, node_gpus: int) -> int:
    """The fewest GPUs the pass starts ``job`` on: its minimum, where one node's idle GPUs give it; a job wider than a
    node starts smaller only on whole nodes (``Pass._elastic_counts``), else at its full size."""
    g = job.min_gpus or job.gpus
    if g <= node_gpus or node_gpus <= 0:
        return g
    on_wholes = -(-g // node_gpus) * node_gpus
    return on_wholes if on_wholes <= job.gpus else job.gpus


class _Ends:
    """When what holds GPUs, memory and CPUs now lets go of them: running jobs (backlog ones too) and this
    pass's starts, by expected end. Built on first use: most passes hold no job back by memory, and
    reserve for no elastic job."""

    def __init__(self, p: Pass, order: Sequence[PendingJob], outcome: Outcome) -> None:
        self.p, self.order, self.started = p, order, outcome.started
        self._events: list[tuple[float, str, int]] | None = None
        self._first: list[tuple[float, str]] | None = None
        self._room: dict[tuple[int, float | None, float | None, str | None], float | None] = {}
        self._together: dict[tuple[str | None, int, bool, bool], float | None] = {}
        self._walks: dict[tuple[bool, bool], _Walk] = {}

    def events(self) -> list[tuple[float, str, int]]:
        """(end, node, GPUs) on schedulable nodes, ends after now only, in time order."""
        if self._events is None:
            p, now, cap = self.p, self.p.now, self.p.capacity
            events = [
                (r.expected_end, node, len(ix))
                for r in p.running
                if r.expected_end > now
                for node, ix in r.gpus_by_node.items()
                if node in cap
            ]
            events += [event for event in self._start_ends() if event[0] > now]
            events.sort(key=_first)
            self._events = events
        return self._events

    def room_frees(self, job: PendingJob) -> float | None:
        """The first end of a running job (or of a start of this pass) on a node that could ever hold a part of
        ``job`` (of its GPU model where it names one): the earliest its memory and CPUs may free there. None when
        nothing there is due to end (what holds them is no job the pool plans: parts that ended, being released)."""
        g = job.min_gpus or job.gpus
        key = (g, job.memory, job.cpus, job.gpu_model)  # all that decides which nodes could hold it
        if key not in self._room:
            if self._first is None:  # each node once, at its first end, soonest first
                first: dict[str, float] = {}
                for t, node, _ in self.events():
                    first.setdefault(node, t)
                self._first = [(t, node) for node, t in first.items()]
            holds = _could_hold(self.p, job, g)
            self._room[key] = next((t for t, node in self._first if holds(node)), None)
        return self._room[key]

    def minimum_frees(self, hold: Held) -> float | None:
        """When an elastic job's minimum is first free together as the pass would start it (one node, or whole
        nodes able to hold parts of a job spanning nodes; of its GPU model where it names one), the holds before
        its own taken off until they end.
        Only after now: GPUs idle now that did not start it are held back by something else."""
        p, job = self.p, hold.job
        g = job.min_gpus or job.gpus
        avail = dict(p.short.count)
        events = self.events()
        before = []
        for h in p.held:
            if h is hold:
                break
            end = h.start_at + h.job.hours * HOUR_S
            for node, k in h.need.items():
                avail[node] = avail.get(node, 0) - k
                before.append((end, node, k))
        if before:
            events = sorted(events + before, key=_first)
        s = p.kind(job)  # its model's nodes where it names one, else the whole pool
        size = s.node_gpus
        if g <= size:
            cap = s.capacity
            for t, node, k in events:
                avail[node] = a = avail.get(node, 0) + k
                if a >= g and cap.get(node, 0) >= g:
                    return t
            return None
        if job.gpus // size * size < g:
            return None  # started smaller, a job spanning nodes takes whole nodes only: never its minimum
        span, wholes_needed = s.span_capacity, -(-g // size)
        wholes = sum(1 for n, a in avail.items() if a >= size and span.get(n, 0) == size)
        for t, node, k in events:
            old = avail.get(node, 0)
            avail[node] = old + k
            if old < size <= old + k and span.get(node, 0) == size:
                wholes += 1
                if wholes >= wholes_needed:
                    return t
        return None

    def together(self, s: Pass | _Kind, g: int, *, before_holds: bool, soft_free: bool) -> float | None:
        """When ``g`` GPUs of shape ``s`` (the pool, or a GPU model's nodes) are first idle together as placement
        would give them if nothing new starts (``_first_together``); None when they never are. ``before_holds``:
        the job ends before the first reservation, so it may use reserved GPUs until then; otherwise each hold of
        this pass keeps the GPUs it took now and takes the first its nodes' running jobs free, until its end.
        ``soft_free``: running backlog jobs' GPUs count as free, as for the next reservation (it preempts them);
        otherwise they free as those jobs end."""
        key = (None if s is self.p else s.model, g, before_holds, soft_free)
        if key not in self._together:
            avail, events, absorb = self._walk(before_holds, soft_free)
            self._together[key] = _first_together(s, g, dict(avail), events, dict(absorb), now=self.p.now)
        return self._together[key]

    def _walk(self, before_holds: bool, soft_free: bool) -> _Walk:
        """What ``together`` walks: GPUs free per node now, the ends that free GPUs in time order (a job past its
        expected end frees them now), and per node the GPUs holds take from those ends first."""
        key = (before_holds, soft_free)
        if key not in self._walks:
            p, now, cap = self.p, self.p.now, self.p.capacity
            running = p.releases() if soft_free else p.running  # releases(): not backlog jobs, where some run
            events = [
                (max(r.expected_end, now), node, len(ix))
                for r in running
                if r.job_id not in p.preempted
                for node, ix in r.gpus_by_node.items()
                if node in cap
            ]
            events += self._start_ends()
            avail = dict(p.short.count)
            if soft_free:
                for node, k in p.soft.items():
                    avail[node] = avail.get(node, 0) + k
            else:  # backlog jobs' GPUs free as they end; a preempted job's, that no hold took, now
                for node, spare in p.preempt_spare.items():
                    avail[node] = avail.get(node, 0) + len(spare)
            absorb: dict[str, int] = {}
            if not before_holds:
                for held in (
                    (p.reserved_hard, p.reserved_soft) if soft_free else (p.reserved_hard,)
                ):  # taken now
                    for node, k in held.items():
                        avail[node] = avail.get(node, 0) - k
                for h in p.held:
                    end = h.start_at + h.job.hours * HOUR_S
                    events += [(end, node, k) for node, k in h.need.items()]
                    for node, k in h.from_releases.items():
                        absorb[node] = absorb.get(node, 0) + k
            events.sort(key=_first)
            self._walks[key] = (avail, events, absorb)
        return self._walks[key]

    def _start_ends(self) -> list[tuple[float, str, int]]:
        """(end, node, GPUs) of this pass's starts."""
        if not self.started:
            return []
        now = self.p.now
        hours = {job.job_id: job.hours for job in self.order if job.job_id in self.started}
        return [
            (now + hours.get(s.job_id, 0.0) * HOUR_S, node, len(ix))
            for s in self.p.starts
            for node, ix in s.gpus_by_node.items()
        ]


_Walk = tuple[dict[str, int], list[tuple[float, str, int]], dict[str, int]]


def _first_together(
    s: Pass | _Kind,
    g: int,
    avail: dict[str, int],
    events: Sequence[tuple[float, str, int]],
    absorb: dict[str, int],
    *,
    now: float,
) -> float | None:
    """The first time (now, or an event's) at which ``avail`` plus the GPUs ``events`` free by then holds ``g`` GPUs
    as placement gives them on shape ``s``: one node able to hold them, or (wider than its largest node) whole nodes
    of that size able to hold parts of a job spanning nodes, and one more such node for the rest. The first GPUs an
    event frees on a node go to ``absorb`` (holds waiting for them) while it wants any. Updates both dicts."""
    size = s.node_gpus
    if g <= size:
        cap = s.capacity
        if any(a >= g and cap.get(n, 0) >= g for n, a in avail.items()):
            return now
        for t, node, k in _freed(events, absorb):
            avail[node] = a = avail.get(node, 0) + k
            if a >= g and cap.get(node, 0) >= g:
                return t
        return None
    whole, rest = divmod(g, size)
    span = s.span_capacity

    def is_whole(n: str, a: int) -> bool:
        return a >= size and span.get(n, 0) == size

    def holds_rest(
        n: str, a: int
    ) -> bool:  # a whole node holds the rest too: one more than ``whole`` is needed
        return rest > 0 and a >= rest and span.get(n, 0) >= rest

    wholes = sum(is_whole(n, a) for n, a in avail.items())
    rests = sum(holds_rest(n, a) for n, a in avail.items())
    if wholes >= whole and (rest == 0 or rests > whole):
        return now
    for t, node, k in _freed(events, absorb):
        old = avail.get(node, 0)
        avail[node] = new = old + k
        wholes += is_whole(node, new) - is_whole(node, old)
        rests += holds_rest(node, new) - holds_rest(node, old)
        if wholes >= whole and (rest == 0 or rests > whole):
            return t
    return None


def _freed(
    events: Sequence[tuple[float, str, int]], absorb: dict[str, int]
) -> Iterator[tuple[float, str, int]]:
    """``events`` less the GPUs holds take from them (``absorb``, per node, updated)."""
    for t, node, k in events:
        wanted = absorb.get(node, 0)
        if wanted:
            taken = min(k, wanted)
            absorb[node] = wanted - taken
            k -= taken
        if k:
            yield t, node, k


def _could_hold(p: Pass, job: PendingJob, g: int) -> Callable[[str], bool]:
    """Whether a node, idle, could give a part of ``g`` of the job's GPUs its memory and CPUs (as placement
    shapes its parts: one node, or whole nodes and one for the rest, of those able to hold spanning parts; of
    its GPU model where it names one)."""
    s = p.kind(job)
    room, size = p.room, s.node_gpus
    if g <= size:
        cap = s.capacity
        return lambda n: cap.get(n, 0) >= g and (room is None or room.ever_fits(job, n, g, g))
    span, rest = s.span_capacity, g % size

    def holds(n: str) -> bool:
        k = span.get(n, 0)
        if room is None:
            return k == size or (rest > 0 and k >= rest)
        return (k == size and room.ever_fits(job, n, size, g)) or (
            rest > 0 and k >= rest and room.ever_fits(job, n, rest, g)
        )

    return holds


def _no_room_unknown(job: PendingJob, size: str) -> Estimate:
    reason = (
        f"{size}; its GPUs are idle, but no node has its memory and CPUs free yet, and no job running on a node "
        "that could hold it is due to end: it starts when the parts holding them are released"
    )
    return Estimate(job.job_id, None, "no_room", reason)


def _fits_if_all_span(p: Pass, g: int) -> bool:
    """Whether the schedulable pool could hold ``g`` GPUs if every node could hold a part of a job spanning nodes."""
    whole, rest = divmod(g, p.node_gpus)
    sizes = list(p.capacity.values())
    big = sizes.count(p.node_gpus)
    return big >= whole and (rest == 0 or big > whole or any(rest <= k < p.node_gpus for k in sizes))


def _span_never(p: Pass, job: PendingJob, g: int) -> Estimate:
    """A job spanning nodes that fits the pool's GPUs, but not the nodes able to isolate its network."""
    size, rest = p.node_gpus, g % p.node_gpus
    able = sum(1 for k in p.span_capacity.values() if k == size or (rest and k >= rest))
    reason = (
        f"{_describe_size(g, size)}, but only {_count(able, 'node')} large enough can hold a part of a job spanning "
        "nodes (the others cannot isolate its network); it can be submitted again for fewer GPUs"
    )
    return Estimate(job.job_id, None, "span_nodes", reason)


def _node_list(need: Mapping[str, int]) -> str:
    names = list(need)
    if len(names) <= 3:
        return ", ".join(names)
    return f"{len(names)} nodes ({names[0]} ... {names[-1]})"


class FairshareExplainer(Explainer):
    """Says when a team further below its share is ahead, with this team's own fair-share numbers
    (the team ahead is not named: the reason is shown to the waiting job's team)."""

    def __init__(
        self,
        *,
        ranking: Ranking,
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
            f"behind another team's job, that team having used less of its share (your team used "
            f"{used_h:,.0f} GPU-h, decayed with a {days:g}-day half-life, against a "
            f"{self.share_pct.get(job.team, 0.0):.0f}% share)"
        )


def _space_never(p: Pass, job: PendingJob) -> Estimate:
    space = f"its attempt space ({format_size(job.space)}: its declared output, the scratch allowance and the log cap)"
    if job.space <= p.largest_disk_paused:  # a node not taking work now holds it: a pause, not a limit
        reason = (
            f"{space} is larger than the disk of any node taking work now; it waits until one whose disk holds it "
            "(draining, drained, or held while its disk was full) takes work again"
        )
        return Estimate(job.job_id, None, "space_paused", reason)
    reason = (
        f"{space} is larger than any node's disk: the largest holds {format_size(p.largest_disk_paused)}; it can be "
        "submitted again declaring less output"
    )
    return Estimate(job.job_id, None, "space_too_large", reason)


def _model_never(p: Pass, job: PendingJob, g: int, kind: _Kind) -> Estimate | None:
    """Why a job that names a GPU model cannot be placed, when its model is why: no node of it takes work now, or
    too few to hold it (the pool as a whole could); None when its model's nodes are not what keeps it off (its
    disk, memory or CPUs, or its size)."""
    if kind.capacity and (p.ever_fits(g, kind) or not p.ever_fits(g)):
        return None
    model = kind.model
    has = (
        f"no node with {model} GPUs is taking jobs now"
        if not kind.capacity
        else f"nodes with {model} GPUs taking jobs now have {kind.total_gpus} of them, "
        f"on {_count(len(kind.capacity), 'node')} of up to {kind.node_gpus}"
    )
    asks = f"asks for {_count(g, f'{model} GPU')}: {has}"
    paused_nodes, paused_gpus = kind.paused
    if paused_nodes and g <= kind.total_gpus + paused_gpus:
        reason = (
            f"{asks}, while {paused_nodes} with them {'is' if paused_nodes == 1 else 'are'} not taking jobs "
            f"({PAUSES}); it waits until {'it takes' if paused_nodes == 1 else 'they take'} jobs again"
        )
        return Estimate(job.job_id, None, "drained_capacity", reason)
    reason = (
        f"{asks}; it waits until enough nodes with that model are up (submitted again without a model, it could "
        "run on any node)"
    )
    return Estimate(job.job_id, None, "gpu_model", reason)


def _room_never(p: Pass, job: PendingJob, g: int, s: Pass | _Kind) -> Estimate:
    """Memory or CPUs declared beyond what the nodes that would hold the job (of shape ``s``) have, each in all."""
    size = min(g, s.node_gpus)
    nodes = [n for name, n in p.room.nodes.items() if s.capacity.get(name, 0) >= size]
    asked = [f"{format_size(job.memory)} of memory" if job.memory is not None else "",
             f"{job.cpus:g} CPUs" if job.cpus is not None else ""]  # fmt: skip
    most = [f"{format_size(max((n.memory for n in nodes), default=0))} of memory" if job.memory is not None else "",
            f"{max((n.cpus for n in nodes), default=0):g} CPUs" if job.cpus is not None else ""]  # fmt: skip
    where = "on one node" if g <= s.node_gpus else "split over the nodes that hold its parts, by GPUs"
    model = f" with {job.gpu_model} GPUs" if s is not p else ""
    reason = (
        f"no node can ever give it what it declares: {' and '.join(filter(None, asked))} for {_count(g, 'GPU')}, "
        f"{where}; a node{model} of {_count(size, 'GPU')} or more offers at most "
        f"{' and '.join(filter(None, most))}; "
        "it can be submitted again declaring less"
    )
    return Estimate(job.job_id, None, "room_too_large", reason)


def _minutes(seconds: float) -> str:
    minutes = -(-seconds // 60)  # a grace of 30 s is "up to 1 minute", never "0 minutes"
    return _count(int(minutes), "minute")


def _count(n: int, noun: str) -> str:
    """'1 node', '4 GPUs', '0 GPUs'."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
