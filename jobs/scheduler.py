"""The live scheduler: coalesced passes of the pure policy over the pool's current state.

A pass reads a snapshot (nodes, running allocations, the ready queue, teams' decayed usage),
asks ``scheduling.policy.plan`` what to start, and applies each start through the RENT service,
where the database still refuses a double-booked GPU. One pass runs at a time across every
process: a PostgreSQL advisory lock (on SQLite, a lock on a file of the state folder).

Passes are requested on every submit, staging completion, release and node change; requests
coalesce through one flag row, and beat runs a safety pass on a timer in case a doorbell was lost.
"""

import fcntl
import logging
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction

from jobs import dependencies, dispatch, nodes, planning, rental, snapshot, units
from jobs.scheduling import policy, types

log = logging.getLogger(__name__)
ADVISORY_LOCK_KEY = 0x0E31_5C4E  # any constant unique to the scheduler pass
# Dependents of a failed prerequisite one pass ends (each a transition, an event and its notifications), under the
# pool-wide lock: a fan-out of 2,000 ended at once held every team's starts for 10 s.
END_PER_PASS = 200
PASS_WAIT_S = 30.0  # how long a requested pass waits for one running elsewhere to end
LOCK_POLL_S = 0.05


@dataclass(frozen=True)
class PassResult:
    started: int
    preempted: int
    pending: int
    elapsed_ms: float


@contextmanager
def pass_lock(*, wait_s: float = 0.0):
    """Yields True while holding the one-pass-at-a-time lock, False if another process held it for all of
    ``wait_s``."""
    if connection.vendor != "postgresql":
        with _file_pass_lock(wait_s=wait_s) as held:
            yield held
        return
    held = _polled(_try_pass_lock, wait_s=wait_s)
    try:
        yield held
    finally:
        if held:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [ADVISORY_LOCK_KEY])


def _polled(try_lock: Callable[[], bool], *, wait_s: float) -> bool:
    """Tries ``try_lock`` until it succeeds or ``wait_s`` has passed (neither lock can wait with a timeout)."""
    deadline = time.monotonic() + wait_s
    while not (held := try_lock()) and time.monotonic() < deadline:
        time.sleep(LOCK_POLL_S)
    return held


@contextmanager
def _file_pass_lock(*, wait_s: float):
    """The embedded default's lock (SQLite has no advisory locks, and a pass is several transactions): a lock on
    a file of the state folder, which every process of one console shares. Each call opens the file afresh, so
    two threads of one worker exclude each other too; the kernel drops it with the process, however it ends."""
    path = settings.STATE_DIR / "scheduler-pass.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock_file:
        held = _polled(lambda: _try_flock(lock_file), wait_s=wait_s)
        try:
            yield held
        finally:
            if held:
                fcntl.flock(lock_file, fcntl.LOCK_UN)


def _try_flock(lock_file) -> bool:
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _try_pass_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [ADVISORY_LOCK_KEY])
        return cursor.fetchone()[0]


def run_pass(*, now: datetime) -> PassResult | None:
    """One pass, or None if another process is running one."""
    with pass_lock() as held:
        return _pass(now=now) if held else None


def _pass(*, now: datetime) -> PassResult:
    """End jobs whose prerequisite failed, snapshot, plan, rent what starts, preempt what must yield, store
    every estimate; under the pass lock."""
    began = time.perf_counter()
    # Before the snapshot, a bounded number: what is left waits held (gates) and is ended by the next passes.
    if len(dependencies.end_unsatisfiable(now=now, limit=END_PER_PASS)) >= END_PER_PASS:
        dispatch.request_scheduler_pass()
    for job_id in dependencies.ready_to_stage():
        dispatch.stage_job(job_id)
    view = snapshot.take(now=now)
    plan = policy.plan(
        now=now.timestamp(), nodes=view.nodes, running=view.running, pending=view.pending,
        usage=view.usage, shares=view.shares, config=view.config,
    )  # fmt: skip
    started = sum(
        rental.rent_job(
            job_id=s.job_id,
            gpus_by_node=s.gpus_by_node,
            now=now,
            reason=_start_reason(s, view),
            after_queueing=True,
        )
        for s in plan.starts
    )
    preempted = sum(rental.request_preemption(job_id=job_id, now=now) for job_id in plan.preemptions)
    planning.store_estimates(plan, now=now)
    elapsed = (time.perf_counter() - began) * 1000
    planning.record_pass(started=started, elapsed_ms=elapsed, now=now)
    return PassResult(started=started, preempted=preempted, pending=len(view.pending), elapsed_ms=elapsed)


def run_requested_passes(*, clock: Callable[[], datetime], limit: int = 20) -> int:
    """Runs passes while requests keep arriving; requests made during a pass trigger one more.

    ``clock`` gives each pass its own ``now``. At most ``limit`` passes, then the doorbell or the
    safety pass picks up what is left. Returns how many passes ran.
    """
    for ran in range(limit):
        with transaction.atomic():
            claimed = dispatch.claim_requested_pass()
        if not claimed:
            return ran
        # A pass running elsewhere may have read the pool before this request's change, and this request is
        # claimed now: wait for that pass to end (well under a second) rather than drop it. The clock is read
        # once the lock is held, so a wait never dates a RENT before what the pass reads.
        with pass_lock(wait_s=PASS_WAIT_S) as held:
            if not held:  # a pass held it that long: ask again, which rings the doorbell for a new try
                dispatch.request_scheduler_pass()
                return ran
            _pass(now=clock())
    return limit


def run_safety_pass(*, now: datetime) -> None:
    """Beat's timer: a pass whether or not one was requested (a doorbell may be lost), then drains settle.

    It answers the requests made before it only once it holds the lock: cleared with a pass running elsewhere,
    a request made during that pass would find its doorbell's task with nothing to do, and wait for the next tick.
    """
    with pass_lock() as held:
        if held:
            dispatch.claim_requested_pass()
            _pass(now=now)
    nodes.settle_drains(now=now)


def _start_reason(start, view) -> str:
    held = types.gpus_held(start.gpus_by_node)
    wanted = view.requested_gpus.get(start.job_id, held)
    where = units.placement(start.gpus_by_node)
    if held > wanted:
        return f"placed on {where} (elastic: {held} GPUs for {wanted} requested, on GPUs nothing else waited for)"
    return f"placed on {where}" + (f" (elastic: {held} of {wanted} GPUs)" if held < wanted else "")
