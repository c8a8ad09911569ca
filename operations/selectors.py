"""Reads shared by the operators' pages: which node actions each node state offers.

Nothing here writes; the writers (``operations.services``) check the same table.
"""

from jobs.models import Node

# The states each node action is offered from: the same table jobs.nodes.set_node_state enforces,
# so a stale page just gets False back.
ACTIONS_BY_STATE: dict[str, tuple[str, ...]] = {
    Node.NodeState.UP: ("drain", "mark-down"),
    Node.NodeState.DRAINING: ("resume", "mark-down"),
    Node.NodeState.DRAINED: ("resume", "mark-down"),
    # A node down for silence comes back when its agent registers again (drained, if an operator drained it),
    # unless an operator marks it down meanwhile: held down then, as a node marked down while up.
    Node.NodeState.DOWN: ("mark-down",),
}


def actions_for(state: str, held_down_by: str = "", *, holding: bool = False) -> tuple[str, ...]:
    """The actions offered on a node: one an operator marked down waits for an operator to resume it; one down
    and ``holding`` nothing (no open allocation, no GPU hold) may be retired (jobs.nodes.retire_node)."""
    offered = (
        ("resume",) if state == Node.NodeState.DOWN and held_down_by else ACTIONS_BY_STATE.get(state, ())
    )
    return (*offered, "retire") if state == Node.NodeState.DOWN and not holding else offered
