"""A job with egress never reaches the node's own networks: the networks it is connected to and the routers it sends
through, even where they are public addresses, while its traffic still leaves through those routers."""

import ipaddress
import subprocess

import pytest

from jobs import network
from tests import machine
from tests.jobs import test_network_limits as limits

outside, part = limits.outside, limits.part  # the stand-in uplink and a part wired through it

# As ``ip -4 -json addr`` and ``ip -4 -json route show table all`` print them on a node with a public uplink.
ADDRESSES = [
    {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
    {"ifname": "eth0", "addr_info": [{"family": "inet", "local": "203.0.113.45", "prefixlen": 26}]},
    {"ifname": "eth1", "addr_info": [{"family": "inet", "local": "198.51.100.9", "prefixlen": 30}]},
]
ROUTES = [
    {"dst": "default", "gateway": "192.0.2.1", "dev": "eth0", "flags": []},
    {"dst": "default", "table": "7", "flags": [],
     "nexthops": [{"gateway": "203.0.113.1", "dev": "eth0"}, {"gateway": "198.51.100.10", "dev": "eth1"}]},
    {"dst": "203.0.113.0/26", "dev": "eth0", "protocol": "kernel", "scope": "link", "prefsrc": "203.0.113.45"},
    {"type": "local", "dst": "127.0.0.1", "dev": "lo", "table": "local", "scope": "host"},
]  # fmt: skip


def denies(net: network.PartNetwork, address: str) -> bool:
    return any(ipaddress.ip_address(address) in ipaddress.ip_network(n) for n in net.deny)


def test_the_nodes_connected_networks_and_every_gateway_are_named():
    found = network.node_networks(ADDRESSES, ROUTES)
    assert {"203.0.113.0/26", "198.51.100.8/30", "192.0.2.1/32"} <= set(found), found
    assert "0.0.0.0/0" not in found  # a default route is a way out, never a network to drop


def test_a_part_with_egress_never_reaches_the_nodes_public_networks_or_gateway():
    node = network.node_networks(ADDRESSES, ROUTES)
    net = network.plan(subnet="100.64.0.0/10", key="abcdefghij", slot=3, gpu_indices=[0], peers=[(3, [0])],
                       egress=True, node=node)  # fmt: skip
    for address in ("203.0.113.50", "198.51.100.10", "192.0.2.1", "203.0.113.1"):
        assert denies(net, address), address
    assert not denies(net, "192.0.2.2") and not denies(net, "8.8.8.8")


def test_a_part_with_egress_is_planned_with_the_nodes_own_networks_as_this_machine_has_them():
    net = network.plan(
        subnet="100.64.0.0/10", key="abcdefghij", slot=3, gpu_indices=[0], peers=[(3, [0])], egress=True
    )
    for found in network.node_networks():
        assert denies(net, str(ipaddress.ip_network(found).network_address)), found


@machine.needs(root=True)
def test_a_wired_part_reaches_the_outside_through_the_gateway_but_not_the_gateway_or_its_network(part):
    """Reproduction: a job's connection to the node's gateway left masqueraded as the node."""
    reached = {}
    for host in (limits.OUTSIDE, limits.ROUTER, limits.NEIGHBOUR):
        ok, _, job = limits.connect(part, host, 1, timeout=2)
        job.communicate("")
        reached[host] = ok
    assert reached == {limits.OUTSIDE: 1, limits.ROUTER: 0, limits.NEIGHBOUR: 0}


@pytest.mark.parametrize(
    "failing",
    [
        subprocess.CompletedProcess(
            [], 1, stdout="", stderr="Cannot open netlink socket: Operation not permitted"
        ),
        subprocess.CompletedProcess([], 0, stdout="[{not json", stderr=""),
    ],
    ids=["exit-status", "unparsable"],
)
def test_a_part_with_egress_is_refused_when_the_nodes_networks_cannot_be_read(monkeypatch, failing):
    """Reproduction: a failing ``ip`` read as no networks at all, and the part reached the node's own again."""
    monkeypatch.setattr(network.subprocess, "run", lambda cmd, **kwargs: failing)
    with pytest.raises(network.NetworkError, match="ip -4 -json addr"):
        network.node_networks()
    with pytest.raises(network.NetworkError):
        network.plan(
            subnet="100.64.0.0/10", key="abcdefghij", slot=3, gpu_indices=[0], peers=[(3, [0])], egress=True
        )
