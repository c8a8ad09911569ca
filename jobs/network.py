"""The network of one part of a job spanning nodes: its own namespace, wired to its job's parts only.

A one-node job gets bubblewrap's private network namespace (its own loopback, nothing else). A part
of a job spanning nodes gets a namespace the agent makes and joins it to before bubblewrap runs:
a veth pair to the node, an address of its own, and an nftables table that lets it reach its own
job's other parts and nothing else — no address of the node itself (the console, PostgreSQL, the
broker, the agent), no other job, no other network. The node forwards only for these veths.

A part whose team an operator allowed egress gets the same wiring plus a way out: the node
masquerades its traffic to the internet, and only there. Everything a job must never reach stays
dropped first: the node itself (the input hook), the platform's own addresses, the node's connected
networks and gateways (its traffic goes through a gateway, never to it), and every private,
loopback, link-local, CGNAT, multicast or reserved range (``NEVER_REACHED``); the one exception is
DNS (port 53) to the node's own resolvers, so names resolve. IPv6 stays off in the namespace.

Every part, with egress or not, takes a bounded share of the node's connection-tracking table for its flows
to anything but its own job's parts: new ones paced, open ones capped, closed TCP ones gone in seconds
(``TRACKED``). Flows between its job's parts are neither: a collective's full mesh opens one or more per rank pair.

Addresses need no coordination at run time: each node owns a /24 of ``E31_JOB_SUBNET`` (its network
slot, the lowest free one given at its first registration and unique in the database), and each part a
/30 of its node's /24 (its lowest GPU index picks which, unique among the node's running parts since no
GPU is held twice). The operator routes each node's /24 to that node.
"""

import ipaddress
import json
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

NODE_PREFIX = 24
PART_PREFIX = 30
# Never reached by a job with egress: private (RFC 1918), loopback, link-local (cloud metadata),
# CGNAT (other jobs' parts), "this network", IETF protocol assignments, benchmarking, multicast, reserved.
KEYED = re.compile(r"e31[-_]?([0-9a-f]{10})")  # a part's namespace, host link or table, named by its key
NEVER_REACHED = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
)  # fmt: skip


# Every flow through a part's link takes an entry in the node's one connection-tracking table (nf_conntrack_max,
# 262,144 on a default node), shared with every other part, the agent and the console: a full table drops new
# connections node-wide. A part's entries stay under TRACKED + NEW_PER_SECOND * CLOSED_SECONDS + NEW_BURST = 1,262,
# so 64 parts (the most a node's /24 serves) hold under a third of a default table, 8 parts under 4 %. Flows between
# a job's own parts take no entry at all (``notrack``): a collective needs many at once (Gloo's full mesh of 128 ranks
# on 16 parts, ~960 a part; NCCL's socket transport, several per peer), and the filter passes them by their addresses
# alone, both ways, so no state is needed; tracked, they were the one way left for a job to fill the table.
TRACKED = 512  # flows open at once (TCP until closed, UDP, ICMP): a download from hundreds of hosts fits
NEW_PER_SECOND = 50  # new flows, DNS queries included: a job fetching from many hosts is paced, a sweep is
NEW_BURST = 250  # opened at once before the pace applies (a pip install's first lookups and connections)
# A closed TCP flow's entry (TIME_WAIT, CLOSE) lasts this long, not conntrack's 120 s: TRACKED no longer counts it.
CLOSED_SECONDS = 10


class NetworkError(Exception):
    pass


@dataclass(frozen=True)
class PartNetwork:
    namespace: str  # under /run/netns
    host_link: str  # the node's end of the veth pair
    host_address: str  # the part's gateway, on the node
    address: str  # the part's own address
    peers: tuple[str, ...]  # the addresses of every part of the job, this one included
    egress: bool = False  # may reach the internet (masqueraded), never what ``deny`` lists
    deny: tuple[str, ...] = NEVER_REACHED  # with egress: networks dropped before anything else
    resolvers: tuple[str, ...] = ()  # with egress: DNS servers it may query on port 53
    subnet: str = "100.64.0.0/10"  # E31_JOB_SUBNET: never masqueraded (parts reach each other as themselves)

    @property
    def table(self) -> str:
        return self.namespace.replace("-", "_")


def slice_count(subnet: str) -> int:
    """How many nodes can own a /24 of ``subnet``."""
    return 2 ** (NODE_PREFIX - ipaddress.IPv4Network(subnet).prefixlen)


def slice_refusal(subnet: str, slot: int | None) -> str:
    """Why a node with this network slot has no /24 of its own in ``subnet`` ('' when it has)."""
    slices = slice_count(subnet)
    if slot is None:
        return f"every /24 of E31_JOB_SUBNET {subnet} ({slices} slices) belongs to another node: widen it"
    if slot < slices:
        return ""
    return f"network slot {slot} has no /24 of its own in E31_JOB_SUBNET {subnet} ({slices} slices): widen it"


def node_slice(subnet: str, slot: int | None) -> ipaddress.IPv4Network:
    """The /24 of ``subnet`` whose addresses the node with this slot gives its parts (route it to the node)."""
    if refused := slice_refusal(subnet, slot):
        raise NetworkError(refused)  # never a wrapped slice: two nodes' parts would share addresses
    network = ipaddress.IPv4Network(subnet)
    return ipaddress.IPv4Network((int(network.network_address) + slot * 256, NODE_PREFIX))


def part_addresses(subnet: str, slot: int | None, gpu_indices: Sequence[int]) -> tuple[str, str]:
    """(the node's end, the part's own address) for the part holding ``gpu_indices`` on the node with ``slot``."""
    lowest = min(gpu_indices)
    if lowest >= 2 ** (32 - NODE_PREFIX - 2):
        raise NetworkError(f"GPU index {lowest} has no address slot: a node's /24 serves 64 parts")
    base = int(node_slice(subnet, slot).network_address) + lowest * 4
    return str(ipaddress.IPv4Address(base + 1)), str(ipaddress.IPv4Address(base + 2))


def plan(*, subnet: str, key: str, slot: int | None, gpu_indices: Sequence[int],
         peers: Sequence[tuple[int | None, Sequence[int]]], egress: bool = False,
         platform: Sequence[str] = (), resolvers: Sequence[str] = (), node: Sequence[str] | None = None) -> PartNetwork:  # fmt: skip
    """The part's network named by ``key`` (ten characters); ``peers``: (network slot, GPU indices) of every part.

    With ``egress``, ``platform`` lists the console's, database's, brokers', caches', registries' and nodes' own networks,
    and ``node`` this node's connected networks and gateways (``node_networks()`` when not given), all dropped like the
    private ranges even where they are public addresses.
    """
    host, own = part_addresses(subnet, slot, gpu_indices)
    addresses = tuple(part_addresses(subnet, peer, gpus)[1] for peer, gpus in peers)
    local = (node_networks() if node is None else node) if egress else ()
    networks = [ipaddress.ip_network(n, strict=False) for n in (*NEVER_REACHED, subnet, *platform, *local)]
    deny = tuple(str(n) for n in ipaddress.collapse_addresses(n for n in networks if n.version == 4))
    return PartNetwork(**_names(key), host_address=host, address=own,
                       peers=addresses, egress=egress, deny=deny, resolvers=tuple(resolvers), subnet=subnet)  # fmt: skip


NODE_RESOLV_CONF = Path("/etc/resolv.conf")
# systemd-resolved's own name servers: the node's /etc/resolv.conf then names only its stub, 127.0.0.53.
RESOLVED_UPSTREAM = Path("/run/systemd/resolve/resolv.conf")


def job_resolv_conf(node_conf: Path = NODE_RESOLV_CONF, *, upstream: Path = RESOLVED_UPSTREAM) -> Path:
    """The file a job reads as its /etc/resolv.conf: the node's, unless it names only loopback servers (a
    stub resolver a job's own network namespace cannot reach) and systemd-resolved lists the upstream ones."""
    if node_resolvers(node_conf) or not node_resolvers(upstream):
        return node_conf
    return upstream


def node_resolvers(resolv_conf: Path | None = None) -> tuple[str, ...]:
    """The IPv4 name servers the job's /etc/resolv.conf names (``job_resolv_conf`` when none is given), loopback
    ones left out: what its egress rules let through."""
    try:
        lines = open(resolv_conf or job_resolv_conf()).read().splitlines()
    except OSError:
        return ()
    found = []
    for fields in (line.split() for line in lines):
        if len(fields) >= 2 and fields[0] == "nameserver":
            try:
                address = ipaddress.IPv4Address(fields[1])
            except ValueError:
                continue
            if not address.is_loopback:
                found.append(str(address))
    return tuple(found)


def node_networks(addresses: list[dict] | None = None, routes: list[dict] | None = None) -> tuple[str, ...]:
    """The node's connected IPv4 networks and the routers its routes go through (``ip -4 -json addr`` and
    ``ip -4 -json route show table all``, read when not given; ``NetworkError`` when they cannot be): a job's traffic
    goes through a gateway, never to it."""
    addresses = _ip_json(["-4", "-json", "addr"]) if addresses is None else addresses
    routes = _ip_json(["-4", "-json", "route", "show", "table", "all"]) if routes is None else routes
    found = []
    for info in (info for link in addresses for info in link.get("addr_info", ())):
        if info.get("family", "inet") == "inet" and info.get("prefixlen"):  # never a /0: that is everything
            found.append(ipaddress.IPv4Interface(f"{info['local']}/{info['prefixlen']}").network)
    hops = [hop for route in routes for hop in (route, *route.get("nexthops", ()))]
    found += [ipaddress.IPv4Network(hop["gateway"]) for hop in hops if hop.get("gateway")]
    return tuple(str(n) for n in ipaddress.collapse_addresses(found))


def _ip_json(args: list[str]) -> list[dict]:
    """What ``ip`` prints; a failure raises, never reads as none: the part would reach the node's own networks."""
    cmd = " ".join(["ip", *args])
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NetworkError(f"{cmd}: {exc}") from exc
    if done.returncode != 0:
        raise NetworkError(f"{cmd}: exit status {done.returncode}: {done.stderr.strip()[:300]}")
    try:
        listed = json.loads(done.stdout)
    except ValueError as exc:
        raise NetworkError(f"{cmd}: unparsable output: {exc}") from exc
    if not isinstance(listed, list):
        raise NetworkError(f"{cmd}: unexpected output: {done.stdout.strip()[:300]}")
    return listed


def describe(net: "PartNetwork | None", *, sandboxed: bool) -> str:
    """What the job page says of a part's network."""
    if not sandboxed:
        return "the node's own network (unsandboxed node)"
    parts = "its job's other parts" if net is not None and len(net.peers) > 1 else ""
    if net is None or not net.egress:
        return f"{parts} only" if parts else "offline: its own loopback only"
    internet = "the internet (IPv4), never the platform, the node or private ranges"
    return f"{internet}, and {parts}" if parts else internet


def wire(net: PartNetwork) -> None:
    """Makes the namespace, the veth pair, the routes and the filter (replacing any stale one)."""
    unwire(net)
    _stale_holder(net.host_address)
    _make(net)
    ns = ["ip", "-n", net.namespace]
    for step in (
        ["ip", "addr", "add", f"{net.host_address}/{PART_PREFIX}", "dev", net.host_link],
        ["ip", "link", "set", net.host_link, "up"],
        [*ns, "link", "set", "lo", "up"],
        [*ns, "addr", "add", f"{net.address}/{PART_PREFIX}", "dev", "eth0"],
        [*ns, "link", "set", "eth0", "up"],
        [*ns, "route", "add", "default", "via", net.host_address],
    ):
        _run(step)
    # Forwarding for these veths only: the node's own interfaces keep theirs as the operator set them.
    _write_sysctl(f"net/ipv4/conf/{net.host_link}/forwarding", "1")
    _run(["ip", "netns", "exec", net.namespace, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])


def _make(net: PartNetwork) -> None:
    """The filter first, so the link never exists unfiltered; then the namespace and the veth pair."""
    _nft(_ruleset(net))
    _run(["ip", "netns", "add", net.namespace])
    _run(["ip", "link", "add", net.host_link, "type", "veth", "peer", "name", "eth0", "netns", net.namespace])


def unwire(net: PartNetwork) -> None:
    """Removes what ``wire`` made; safe to call when nothing (or only part of it) exists."""
    for step in (
        ["ip", "link", "del", net.host_link],
        ["ip", "netns", "del", net.namespace],
        ["nft", "delete", "table", "inet", net.table],
    ):
        _quietly(step)


def _names(key: str) -> dict[str, str]:
    return {"namespace": f"e31-{key}", "host_link": f"e31{key}"}


def wired_keys() -> set[str]:
    """The keys of every part namespace, host link and table on this machine, whichever agent made them."""
    listings = (["ip", "netns", "list"], ["ip", "-o", "link", "show"], ["nft", "list", "tables"])
    names = []
    for cmd in listings:
        # ``ip -o link``: "7: e31<key>@if2: <...>"; ``ip netns``: "e31-<key> (id: 3)"; nft: "table inet e31_<key>"
        names += [
            word.split("@")[0].rstrip(":") for line in _quietly(cmd).splitlines() for word in line.split()
        ]
    return {match.group(1) for name in names if (match := KEYED.fullmatch(name))}


def unwire_key(key: str) -> None:
    """Removes what ``wire`` made for the part named by ``key`` (an agent that died left it)."""
    unwire(PartNetwork(**_names(key), host_address="", address="", peers=()))


def refusal() -> str:
    """Why this node cannot wire parts of jobs spanning nodes ('' when it can), from a real trial."""
    if os.geteuid() != 0:
        return "the agent is not root: it cannot make network namespaces, veth pairs or nftables rules"
    net = plan(
        subnet="100.127.255.0/24",
        key=f"p{os.getpid():09d}"[-10:],
        slot=0,
        gpu_indices=[63],
        peers=[(0, [63])],
    )
    try:
        _make(net)  # no address: a trial never disturbs a running part
    except (NetworkError, OSError, subprocess.SubprocessError) as exc:
        return f"cannot isolate a job's network here: {exc}"
    finally:
        unwire(net)
    return ""


def _ruleset(net: PartNetwork) -> str:
    others = ", ".join(p for p in net.peers if p != net.address) or net.address
    link = f'"{net.host_link}"'
    out = f"iifname {link} ip saddr {net.address}"
    return f"""
table inet {net.table} {{
    ct timeout closing {{
        protocol tcp; l3proto ip
        policy = {{ time_wait: {CLOSED_SECONDS}, close: {CLOSED_SECONDS} }}
    }}
    chain untracked {{
        type filter hook prerouting priority raw; policy accept;
        {out} ip daddr {{ {others} }} notrack
        ip saddr {{ {others} }} ip daddr {net.address} notrack
    }}
    chain input {{
        type filter hook input priority 0; policy accept;
        iifname {link} drop
    }}
    chain forward {{
        type filter hook forward priority 0; policy accept;
        {out} ip daddr {{ {others} }} accept
        iifname {link} ct state new jump tracked
        {_egress_rules(net, out) if net.egress else ""}
        iifname {link} drop
        oifname {link} ip saddr {{ {others} }} ip daddr {net.address} accept
        {f"oifname {link} ip daddr {net.address} ct state established,related accept" if net.egress else ""}
        oifname {link} drop
    }}
    chain tracked {{
        limit rate over {NEW_PER_SECOND}/second burst {NEW_BURST} packets drop
        ct count over {TRACKED} drop
        ct timeout set "closing"
    }}
    {_masquerade(net) if net.egress else ""}
}}
"""


def _egress_rules(net: PartNetwork, out: str) -> str:
    """DNS to the node's resolvers, then every network it must never reach dropped, then the rest accepted."""
    dns = ", ".join(net.resolvers)
    rules = [f"{out} ip daddr {{ {dns} }} {proto} dport 53 accept" for proto in ("udp", "tcp")] if dns else []
    rules += [f'iifname "{net.host_link}" ip daddr {{ {", ".join(net.deny)} }} drop', f"{out} accept"]
    return "\n        ".join(rules)


def _masquerade(net: PartNetwork) -> str:
    """Its traffic leaves with the node's address; to its own job's parts it keeps its own."""
    return f"""chain postrouting {{
        type nat hook postrouting priority 100; policy accept;
        ip saddr {net.address} ip daddr != {net.subnet} masquerade
    }}"""


def _stale_holder(address: str) -> None:
    """A link left by a part that ended without clean-up still holding this address goes first."""
    shown = subprocess.run(["ip", "-o", "addr", "show", "to", address], capture_output=True, text=True)
    for line in shown.stdout.splitlines():
        link = line.split()[1].split("@")[0]
        if link.startswith("e31"):
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=20)


def _nft(ruleset: str) -> None:
    done = subprocess.run(["nft", "-f", "-"], input=ruleset, capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise NetworkError(f"nft: {done.stderr.strip()[:300]}")


def _quietly(cmd: list[str]) -> str:
    """The output of a listing or removal whose failure leaves nothing to do: '' where the tool is not
    installed (a machine without ``ip`` or ``nft`` has none of their objects, and refuses to make them)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
    except FileNotFoundError:
        return ""


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise NetworkError(f"{' '.join(cmd[:4])}: {done.stderr.strip()[:300]}")


def _write_sysctl(key: str, value: str) -> None:
    with open(f"/proc/sys/{key}", "w") as handle:
        handle.write(value)
