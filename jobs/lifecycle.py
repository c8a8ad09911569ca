"""The job lifecycle: states, the transition table and typed end reasons.

Pure Python, no Django: services consult it before every conditional UPDATE, the tests
explore it with hypothesis, and the simulator shares its vocabulary.

    SUBMIT -> STAGE -> QUEUE -> RENT -> RUN -> OUTPUT -> RELEASE
    submitted  staging  queued  rented  running  output  released

A job that ends before RENT is ``ended`` and was never metered; every job that reached RENT
finishes ``released``, whatever happened, so the meter always stops. A job that lost its node
(or yielded to a reservation) and may be requeued goes back to ``queued`` as a new attempt.
"""

from enum import StrEnum


class State(StrEnum):
    SUBMITTED = "submitted"
    STAGING = "staging"
    QUEUED = "queued"
    RENTED = "rented"
    RUNNING = "running"
    OUTPUT = "output"
    RELEASED = "released"
    ENDED = "ended"


class EndReason(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    OUT_OF_MEMORY = "out_of_memory"  # the kernel stopped it at its memory limit (cgroup OOM kill)
    CANCELLED = "cancelled"
    NODE_LOST = "node_lost"
    STAGING_FAILED = "staging_failed"
    OUTPUT_FAILED = "output_failed"
    REJECTED = "rejected"
    DEPENDENCY_FAILED = "dependency_failed"  # a job it runs after did not end as it required; never metered


# Ends where the job itself decided how long it ran (not cancelled, lost or refused): what run times are learned from.
RAN_TO_ITS_END = (EndReason.SUCCEEDED, EndReason.FAILED, EndReason.TIMED_OUT, EndReason.OUT_OF_MEMORY)

# Reasons that move a job without ending it.
REQUEUED = "requeued"
PREEMPTED = "preempted"
RETRIED = (
    "retried"  # its part could not start: a GPU was still in use on the node (no attempt of its own counted)
)

TERMINAL = frozenset({State.RELEASED, State.ENDED})
HOLDS_COMPUTE = frozenset({State.RENTED, State.RUNNING, State.OUTPUT})
BEFORE_RENT = frozenset({State.SUBMITTED, State.STAGING, State.QUEUED})
ALIVE = frozenset(State) - TERMINAL

# The only end reasons each terminal state can carry.
ENDED_REASONS = frozenset(
    {EndReason.CANCELLED, EndReason.STAGING_FAILED, EndReason.REJECTED, EndReason.DEPENDENCY_FAILED}
)
RELEASED_REASONS = frozenset(EndReason) - {
    EndReason.STAGING_FAILED,
    EndReason.REJECTED,
    EndReason.DEPENDENCY_FAILED,
}

TRANSITIONS: dict[State, frozenset[State]] = {
    State.SUBMITTED: frozenset({State.STAGING, State.ENDED}),
    State.STAGING: frozenset({State.QUEUED, State.ENDED}),
    State.QUEUED: frozenset({State.RENTED, State.ENDED}),
    State.RENTED: frozenset({State.RUNNING, State.RELEASED, State.QUEUED}),
    State.RUNNING: frozenset({State.OUTPUT, State.RELEASED, State.QUEUED}),
    State.OUTPUT: frozenset({State.RELEASED, State.QUEUED}),
    State.RELEASED: frozenset(),
    State.ENDED: frozenset(),
}

# The seven steps a team sees on the timeline, in order, with the state that begins each.
STEPS: tuple[tuple[str, State], ...] = (
    ("Submit", State.SUBMITTED),
    ("Stage", State.STAGING),
    ("Queue", State.QUEUED),
    ("Rent", State.RENTED),
    ("Run", State.RUNNING),
    ("Output", State.OUTPUT),
    ("Release", State.RELEASED),
)


class IllegalTransition(ValueError):
    pass


def check_transition(current: State | str, target: State | str, reason: str | None = None) -> None:
    """Raises IllegalTransition unless ``current -> target`` (with that reason) is in the table."""
    current, target = State(current), State(target)
    if target not in TRANSITIONS[current]:
        raise IllegalTransition(f"{current} -> {target} is not a job transition")
    if target is State.ENDED and EndReason(reason) not in ENDED_REASONS:
        raise IllegalTransition(f"a job that ends before RENT cannot end as {reason!r}")
    if target is State.RELEASED and EndReason(reason) not in RELEASED_REASONS:
        raise IllegalTransition(f"a released job cannot end as {reason!r}")
    if target is State.QUEUED and current in HOLDS_COMPUTE and reason not in (REQUEUED, PREEMPTED, RETRIED):
        raise IllegalTransition("a job goes back to the queue only when requeued, preempted or retried")


def is_terminal(state: State | str) -> bool:
    return State(state) in TERMINAL


# What a dependent job needs of its prerequisite: to have succeeded, or only to have ended.
AFTER_OK, AFTER_ANY = "after_ok", "after_any"
MET, WAITING, FAILED = "met", "waiting", "failed"


def prerequisite_outcome(*, kind: str, state: str, end_reason: str, delivery_state: str) -> str:
    """MET, WAITING or FAILED (after_ok only): what a prerequisite in this state means for its dependent.

    A prerequisite counts as ended once its outputs are delivered (or delivery failed), since that is
    what a pipeline's next step reads; a success whose delivery failed did not succeed.
    """
    if not is_terminal(state) or delivery_state == "delivering":
        return WAITING
    if kind == AFTER_ANY:
        return MET
    return MET if end_reason == EndReason.SUCCEEDED and delivery_state != "failed" else FAILED


def notice_for(target: State | str, end_reason: str) -> str:
    """The event a team hears of when a job moves to ``target``: started, ended, staging_failed or ""."""
    if State(target) is State.RUNNING:
        return "started"
    if State(target) is State.ENDED and end_reason == EndReason.STAGING_FAILED:
        return "staging_failed"
    return "ended" if State(target) in TERMINAL else ""
