"""The transition table, explored: every path from SUBMIT ends in exactly one terminal state."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.lifecycle import (
    ENDED_REASONS,
    HOLDS_COMPUTE,
    PREEMPTED,
    RELEASED_REASONS,
    REQUEUED,
    TERMINAL,
    TRANSITIONS,
    EndReason,
    IllegalTransition,
    State,
    check_transition,
)  # fmt: skip

ALL_REASONS = [*map(str, EndReason), REQUEUED, PREEMPTED, "", "because"]


def legal(current: State, target: State, reason: str) -> bool:
    try:
        check_transition(current, target, reason)
    except (IllegalTransition, ValueError):
        return False
    return True


@given(st.sampled_from(list(State)), st.sampled_from(list(State)), st.sampled_from(ALL_REASONS))
def test_a_transition_is_legal_only_if_the_table_and_its_reason_allow_it(current, target, reason):
    allowed = target in TRANSITIONS[current]
    if target is State.ENDED:
        allowed = allowed and reason in ENDED_REASONS
    elif target is State.RELEASED:
        allowed = allowed and reason in RELEASED_REASONS
    elif target is State.QUEUED and current in HOLDS_COMPUTE:
        allowed = allowed and reason in (REQUEUED, PREEMPTED)
    assert legal(current, target, reason) == allowed


@given(st.lists(st.tuples(st.sampled_from(list(State)), st.sampled_from(ALL_REASONS)), max_size=40))
def test_any_walk_that_reached_rent_can_only_end_released_and_never_leaves_a_terminal_state(steps):
    state, rented = State.SUBMITTED, False
    for target, reason in steps:
        if not legal(state, target, reason):
            continue
        assert state not in TERMINAL, "nothing leaves a terminal state"
        rented = rented or target is State.RENTED
        if target is State.QUEUED and state in HOLDS_COMPUTE:
            rented = False  # a requeued attempt starts again before RENT
        state = target
        if state is State.ENDED:
            assert not rented, "a job that held compute must end RELEASED, so its meter stops"


def test_an_illegal_transition_raises():
    with pytest.raises(IllegalTransition):
        check_transition(State.QUEUED, State.RUNNING)
    with pytest.raises(IllegalTransition):
        check_transition(State.RUNNING, State.ENDED, EndReason.CANCELLED)
    with pytest.raises(IllegalTransition):
        check_transition(State.RUNNING, State.QUEUED, "because")
