"""What a node offers its jobs keeps a reserve for the agent and the system."""

import pytest

from jobs import limits

GIB = 2**30


@pytest.fixture
def machine_with(monkeypatch):
    def fake(physical: int, agent_limit: int | None = None) -> None:
        pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": physical // 4096}
        monkeypatch.setattr(limits.os, "sysconf", lambda name: pages[name])
        monkeypatch.setattr(limits, "hierarchies", lambda: {"memory": object()} if agent_limit else {})
        monkeypatch.setattr(limits, "_own_memory_limit", lambda hierarchy: agent_limit)

    return fake


def test_the_node_offers_its_memory_less_a_reserve(machine_with, settings):
    """A job on every GPU with no memory declared got all of the node's memory as its limit: the agent's group
    ran out before the job's did, and the kernel killed the agent, ending every job on the node."""
    settings.E31_NODE_RESERVED_MEMORY_BYTES = None
    machine_with(64 * GIB)
    assert limits.node_memory() == 64 * GIB - 64 * GIB // 20
    machine_with(4 * GIB)
    assert limits.node_memory() == 4 * GIB - 512 * 2**20  # at least 512 MiB kept back
    machine_with(64 * GIB, agent_limit=GIB)
    assert limits.node_memory() == GIB // 2  # never more than half kept back
    assert limits.node_memory(cap=100 * 2**20) == 100 * 2**20  # the operator's --memory, where lower


def test_the_operator_sets_the_reserve(machine_with, settings):
    settings.E31_NODE_RESERVED_MEMORY_BYTES = 8 * GIB
    machine_with(64 * GIB)
    assert limits.node_memory() == 56 * GIB
    settings.E31_NODE_RESERVED_MEMORY_BYTES = 0  # nothing kept back: the machine's all, as before
    assert limits.node_memory() == 64 * GIB
