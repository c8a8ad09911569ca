"""Egress per team on real agents: offline by default; allowed, the internet only.

No outside address is reachable from this machine, so "the internet" is a network namespace the
test wires to the node through a veth of its own, the node's gateway (a public-looking network of
the node's, TEST-NET-3) holding a public-looking address behind it (198.51.100.7, TEST-NET-2) with a
listener, and private addresses (10.x, 172.16.x): a job must reach the first through the gateway and
never the gateway, the others, the node's own address or the console.
"""

import http.server
import json
import subprocess
import sys
import threading
import uuid

import pytest
from django.test import Client
from django.utils import timezone

from jobs import network
from jobs.models import Job
from operations import services as operations
from tests import machine
from tests.e2e.conftest import wait_for_state
from tests.e2e.test_confinement_e2e import node_addresses
from tests.e2e.test_lifecycle_e2e import py, submit
from tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
INTERNET, PRIVATE, PRIVATE_172 = "198.51.100.7", "10.213.77.7", "172.31.77.7"
# The node's end of its uplink and its gateway to the internet: the node's own public network, never reached.
UPLINK, GATEWAY = "203.0.113.233", "203.0.113.234"

PROBE = """
import json, socket, sys
out = {}
for name, host, port in json.loads(sys.argv[1]):
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((host, port)); s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')
        answer = b''
        while chunk := s.recv(4096):  # to the end: headers and body may come in separate reads
            answer += chunk
        out[name] = 'reached: ' + answer.decode(errors='replace').split('\\r\\n\\r\\n')[-1]
    except OSError as exc:
        out[name] = type(exc).__name__
    finally:
        s.close()
print(json.dumps(out))
"""


SERVER = """
import http.server
class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'hello from the internet')
http.server.ThreadingHTTPServer(('0.0.0.0', 8080), Hello).serve_forever()
"""
READY = """
import socket, sys, time
for _ in range(100):
    try:
        socket.create_connection(('127.0.0.1', 8080), 1); sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit(1)
"""


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello from the internet")

    def log_message(self, *args):
        pass


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=20)


@pytest.fixture
def the_internet():
    """A namespace standing for the internet behind the node's gateway, on an uplink with forwarding on."""
    tag = uuid.uuid4().hex[:6]
    ns, host_link = f"e31inet-{tag}", f"e31i{tag}"
    # A run killed mid-test left its stand-in: its stale uplink would take the new one's traffic.
    machine.clear_leftovers(
        "e31inet-", routes=tuple(f"{address}/32" for address in (INTERNET, PRIVATE, PRIVATE_172))
    )
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "add", host_link, "type", "veth", "peer", "name", "uplink", "netns", ns)
        sh("ip", "addr", "add", f"{UPLINK}/29", "dev", host_link)
        sh("ip", "link", "set", host_link, "up")
        with open(f"/proc/sys/net/ipv4/conf/{host_link}/forwarding", "w") as handle:
            handle.write("1")  # replies come back in on the uplink: the operator enables forwarding there
        for address in (f"{GATEWAY}/29", f"{INTERNET}/32", f"{PRIVATE}/32", f"{PRIVATE_172}/32"):
            sh("ip", "-n", ns, "addr", "add", address, "dev", "uplink")
        sh("ip", "-n", ns, "link", "set", "uplink", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "route", "add", "default", "via", UPLINK)
        for address in (INTERNET, PRIVATE, PRIVATE_172):  # the node routes them through its gateway
            sh("ip", "route", "add", f"{address}/32", "via", GATEWAY)
        server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", SERVER])
        try:
            probe = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", READY], timeout=30)
            assert probe.returncode == 0, "the stand-in for the internet did not start"
            yield
        finally:
            server.kill()
    finally:
        for address in (INTERNET, PRIVATE, PRIVATE_172):
            subprocess.run(["ip", "route", "del", f"{address}/32"], capture_output=True)
        subprocess.run(["ip", "link", "del", host_link], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def teams():
    allowed = MembershipFactory(
        team=TeamFactory(name="vision", slug="vision"), user=UserFactory(username="alice")
    )
    offline = MembershipFactory(
        team=TeamFactory(name="audio", slug="audio"), user=UserFactory(username="bob")
    )
    return allowed, offline


def test_jobs_are_offline_by_default_and_an_allowed_team_reaches_the_internet_only(live_pool, the_internet):
    operator = UserFactory(username="olga", is_staff=True)
    allowed, offline = teams()
    operations.set_team_egress(team_id=allowed.team.id, allowed=True, actor=operator, now=timezone.now())
    console = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Hello)
    threading.Thread(target=console.serve_forever, daemon=True).start()
    port = console.server_address[1]
    targets = [("internet", INTERNET, 8080), ("private 10/8", PRIVATE, 8080), ("private 172.16/12", PRIVATE_172, 8080),
               ("the node's gateway", GATEWAY, 8080),
               ("console on loopback", "127.0.0.1", port), ("postgresql", "127.0.0.1", 5432)]  # fmt: skip
    targets += [(f"node address {ip}", ip, port) for ip in node_addresses()]
    try:
        jobs = {
            name: submit(member.user, [*py(PROBE), json.dumps(targets)], name=f"egress-{name}")
            for name, member in (("allowed", allowed), ("offline", offline))
        }
        done = {name: wait_for_state(job.id, "released", timeout=120) for name, job in jobs.items()}
    finally:
        console.shutdown()
    seen = {}
    for name, job in done.items():
        assert job.end_reason == "succeeded", job.log_tail
        seen[name] = json.loads(job.log_tail.strip().splitlines()[-1])
    assert seen["allowed"]["internet"] == "reached: hello from the internet"
    reached = {name: [t for t, r in tried.items() if r.startswith("reached")] for name, tried in seen.items()}
    assert reached == {"allowed": ["internet"], "offline": []}, seen
    assert seen["offline"]["internet"] == "OSError" or seen["offline"]["internet"].endswith("Error")

    notes = {name: job.allocations.get().network for name, job in done.items()}
    assert notes["allowed"].startswith("the internet") and notes["offline"].startswith("offline")
    client = Client()
    client.force_login(operator)
    for name, job in done.items():
        page = client.get(f"/jobs/{job.id}/").content.decode()
        assert f"network: {notes[name]}" in page
    assert not Job.objects.filter(id__in=[j.id for j in done.values()], end_reason="failed").exists()


def test_the_filter_drops_the_platform_and_private_ranges_before_the_one_accept():
    """The ruleset as nft reads it: DNS to the node's resolvers, the deny set, then the internet."""
    net = network.plan(subnet="100.64.0.0/10", key="abcdefghij", slot=3, gpu_indices=[0], peers=[(3, [0])],
                       egress=True, platform=["203.0.113.9/32", "10.1.2.3/32"], resolvers=["10.255.255.53"])  # fmt: skip
    rules = network._ruleset(net)
    check = subprocess.run(["nft", "-c", "-f", "-"], input=rules, text=True, capture_output=True)
    assert check.returncode == 0, check.stderr
    forward = rules.split("chain forward")[1].split("\n    }")[0]
    order = [line.strip() for line in forward.splitlines() if "iifname" in line]
    deny = next(i for i, line in enumerate(order) if line.endswith("drop") and "daddr {" in line)
    accept = next(i for i, line in enumerate(order) if line.endswith(f"saddr {net.address} accept"))
    assert deny < accept
    for private in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
        "100.64.0.0/10",
        "203.0.113.9/32",
    ):
        assert private in order[deny]
    assert all("dport 53" in line for line in order[:deny] if "10.255.255.53" in line)
    offline = network.plan(
        subnet="100.64.0.0/10", key="abcdefghij", slot=3, gpu_indices=[0], peers=[(3, [0])]
    )
    assert "masquerade" not in network._ruleset(offline) and "masquerade" in rules
