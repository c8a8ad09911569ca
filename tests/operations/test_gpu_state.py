"""One rule for a GPU's state, read by the pool page's cells and by /metrics' e31_node_gpus."""

import re
from collections import Counter

import pytest
import time_machine

from jobs.models import Node
from operations import metrics, pool
from tests.operations import test_metrics

NOW = test_metrics.NOW
UP, DOWN, DRAINING, DRAINED = (Node.NodeState.UP, Node.NodeState.DOWN, Node.NodeState.DRAINING,
                               Node.NodeState.DRAINED)  # fmt: skip


@pytest.mark.parametrize(
    ("present", "held", "node_state", "reserved", "state"),
    [
        (False, True, UP, True, "missing"),  # a GPU its agent no longer finds is missing, even under a hold
        (True, True, DOWN, True, "held"),  # held wins over its node's state: the job still holds it
        (True, False, DOWN, True, "offline"),  # a down node's GPUs are offline, reserved or not
        (True, False, UP, True, "reserved"),
        (True, False, UP, False, "idle"),
        (True, False, DRAINING, True, "reserved"),  # the page draws a draining node's GPUs as any other's
        (True, False, DRAINED, False, "idle"),
    ],
)
def test_a_gpus_state_on_the_pool_page_follows_one_order(present, held, node_state, reserved, state):
    assert pool.gpu_state(present=present, held=held, node_state=node_state, reserved=reserved) == state


@pytest.mark.parametrize(("held", "reserved", "state"), [(False, True, "drained"), (False, False, "drained"),
                                                         (True, True, "held")])  # fmt: skip
def test_metrics_count_a_draining_nodes_unheld_gpus_as_drained(held, reserved, state):
    node = metrics.NodeRow(id=1, name="gpu-a", state=DRAINING, gpus=2, last_heartbeat=None)
    held_gpus, reserved_gpus = ({(1, 0)} if held else set()), ({("gpu-a", 0)} if reserved else set())
    assert metrics.gpu_state(node, 0, held=held_gpus, reserved=reserved_gpus) == state


CELL = re.compile(r'<span class="gpu (?P<kind>off|reserved|free)" title="GPU \d+[^"]*?(?P<down>node down)?"|'
                  r'<a class="gpu team-')  # fmt: skip


def _drawn(cell: re.Match) -> str:
    """A cell's state, as its colour (and a grey cell's title) shows it."""
    if cell["kind"] == "off":
        return "offline" if cell["down"] else "missing"
    return {None: "held", "reserved": "reserved", "free": "idle"}[cell["kind"]]


def _drawn_by_node(rows: str) -> dict[str, Counter]:
    return {
        re.search(r"<strong>([^<]+)</strong>", row)[1]: Counter(map(_drawn, CELL.finditer(row)))
        for row in rows.split("<tr ")[1:]
    }


@pytest.fixture
def known_pool(team):
    with time_machine.travel(NOW, tick=False):
        test_metrics.build_pool(team)
        test_metrics.record_the_platform_rows()


@pytest.mark.django_db
def test_the_pool_page_draws_each_gpu_as_the_metrics_count_it(known_pool):
    """Save drained: the page has no colour for it, so a drained node's free GPUs are drawn free."""
    drawn = _drawn_by_node(pool.pool_page(now=NOW).rows)
    for node, counted in test_metrics.EXPECTED_GPUS.items():
        expected = Counter()
        for state, n in counted.items():
            expected["idle" if state == "drained" else state] += n
        assert drawn[node] == +expected, node  # + drops the states with no GPU
