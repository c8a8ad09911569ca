"""A job is a stranger (issue 13): its own uid, an allow-listed view, no host socket, no platform secret.

Each test runs real jobs on the e2e pool's agents, in bubblewrap, and looks from both sides: what
the job reports from inside, and what the host shows (``ps``, file owners, the attempt directory).
"""

import http.server
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from jobs import network, sandbox
from jobs.models import Job, Node
from tests.e2e.conftest import UIDS_PER_AGENT, wait_for, wait_for_state
from tests.e2e.test_lifecycle_e2e import py, submit
from tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture
def member(live_pool):
    return MembershipFactory(
        team=TeamFactory(name="vision", slug="vision"), user=UserFactory(username="alice")
    ).user


def report(job: Job) -> dict:
    """The JSON line a probe job printed last."""
    assert job.end_reason == "succeeded", job.log_tail
    return json.loads(job.log_tail.strip().splitlines()[-1])


def host_uids_of(marker: str) -> set[int]:
    """The host's view (``ps``) of the processes whose command line carries ``marker``."""
    lines = subprocess.run(
        ["ps", "-ww", "-eo", "uid=,args="], capture_output=True, text=True
    ).stdout.splitlines()
    return {int(line.split(None, 1)[0]) for line in lines if marker in line and "ps -eo" not in line}


SETUID_PROBE = """
import json, os, shutil, subprocess, sys, time
out = {'uid': os.getuid(), 'gid': os.getgid()}
try:
    out['shadow'] = open('/etc/shadow').read()[:20]
except OSError as exc:
    out['shadow'] = type(exc).__name__
out['root_listing'] = os.listdir('/root') if os.path.isdir('/root') else 'absent'
home = os.environ['HOME']
shutil.copy('/usr/bin/id', home + '/id')
os.chmod(home + '/id', 0o4755)
out['home_mount'] = [l for l in open('/proc/self/mountinfo') if ' ' + home + ' ' in l][0]
open(home + '/ready', 'w').write(json.dumps(out))
time.sleep(float(sys.argv[1]))
print(json.dumps(out))
"""


def test_a_job_runs_under_its_own_uid_and_its_setuid_copy_grants_nothing(live_pool, member, settings):
    """Reproduction 1: /etc/shadow, /root, and `cp /usr/bin/id $HOME/id && chmod 4755` on the host."""
    marker = f"setuid-probe-{uuid.uuid4().hex[:8]}"
    job = submit(member, [*py(SETUID_PROBE), "15", marker])
    job = wait_for_state(job.id, "running")
    allocation = job.allocations.get()
    work = sandbox.attempt_dirs(allocation).work
    wait_for(lambda: (work / "ready").exists(), what="the probe to copy id")
    inside = json.loads((work / "ready").read_text())
    base = live_pool.uid_base(allocation.node.name)
    assert base <= inside["uid"] < base + UIDS_PER_AGENT and inside["gid"] == inside["uid"]
    assert host_uids_of(marker) == {inside["uid"]}  # every process of the job, bwrap included
    copied = (work / "id").stat()
    assert copied.st_uid == inside["uid"] != 0  # setuid to the job's own uid at most, never root's
    assert copied.st_mode & stat.S_ISUID
    assert stat.S_IMODE(work.stat().st_mode) == 0o700 and work.stat().st_uid == inside["uid"]
    assert "nosuid" in inside["home_mount"].split(" - ")[0].split()[5]
    assert inside["shadow"] == "FileNotFoundError" and inside["root_listing"] == "absent"
    job = wait_for_state(job.id, "released")
    assert job.end_reason == "succeeded", job.log_tail
    attempt_root = sandbox.attempt_dirs(allocation).root
    wait_for(lambda: not attempt_root.exists(), timeout=20, what="the attempt directory to go after delivery")


def test_a_job_cannot_reach_a_host_unix_socket(live_pool, member, tmp_path):
    """Reproduction 2: a root-only socket under /var/tmp, and an abstract one, while the job runs."""
    path = Path(f"/var/tmp/e31-{uuid.uuid4().hex[:8]}.sock")
    abstract = f"\0e31-{uuid.uuid4().hex[:8]}"
    listeners = []
    for address in (str(path), abstract):
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(address)
        server.listen(4)
        listeners.append(server)
    path.chmod(0o600)
    probe = f"""
import json, socket
out = {{}}
for name, address in (('path', {str(path)!r}), ('abstract', {abstract!r})):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(address); s.sendall(b'hello'); out[name] = 'connected'
    except OSError as exc:
        out[name] = type(exc).__name__
print(json.dumps(out))
"""
    try:
        seen = report(wait_for_state(submit(member, py(probe)).id, "released"))
    finally:
        for server in listeners:
            server.close()
        path.unlink()
    assert seen == {"path": "FileNotFoundError", "abstract": "ConnectionRefusedError"}


CENSUS = """
import json, os, socket, stat
seen = []
for top in sorted(os.listdir('/')):
    seen.append('/' + top)
    if os.path.isdir('/' + top) and not os.path.islink('/' + top):
        try:
            seen += ['/' + top + '/' + name for name in sorted(os.listdir('/' + top))]
        except OSError:
            pass
sockets = []
for root, dirs, files in os.walk('/'):
    if root == '/proc':
        dirs[:] = []
    for name in files:
        try:
            if stat.S_ISSOCK(os.lstat(os.path.join(root, name)).st_mode):
                sockets.append(os.path.join(root, name))
        except OSError:
            pass
sockets += ['\\0' + line.split()[-1][1:] for line in open('/proc/net/unix').read().splitlines()[1:] if line.split()[-1].startswith('@')]
connected = []
for address in sockets:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(address); connected.append(address)
    except OSError:
        pass
print(json.dumps({'seen': seen, 'sockets': sockets, 'connected': connected}))
"""


def allowed_by_the_view(path: str, own: list[str]) -> bool:
    """On the list (sandbox.VIEW and the attempt's own directories), under an entry, or on the way to one."""
    listed = [
        *sandbox.VIEW["system"],
        *sandbox.VIEW["etc"],
        *sandbox.VIEW["synthesized"],
        *sandbox.VIEW["private"],
        *own,
    ]
    return any(
        path == entry or path.startswith(entry + "/") or entry.startswith(path + "/") for entry in listed
    )


@pytest.mark.parametrize("live_pool", [{"roots_outside_tmp": True}], indirect=True)
def test_the_census_finds_only_the_allow_list_and_no_connectable_socket(live_pool, member, settings):
    """Reproduction 4 with the census: roots outside /tmp, SECRET_KEY_FILE and DATABASE_URL_FILE set."""
    secrets = [live_pool.env["SECRET_KEY_FILE"], live_pool.env["DATABASE_URL_FILE"]]
    other_team = settings.E31_OUTPUT_ROOTS[0] / "other-team"
    other_team.mkdir()
    (other_team / "results.txt").write_text("another team's results")
    host_socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    host_socket.bind(f"\0e31-census-{live_pool.tag}")
    host_socket.listen(1)
    try:
        job = wait_for_state(submit(member, py(CENSUS)).id, "released", timeout=90)
    finally:
        host_socket.close()
    census = report(job)
    dirs = sandbox.attempt_dirs(job.allocations.get())
    own = [str(dirs.work), str(dirs.output), str(dirs.data)]
    strangers = [path for path in census["seen"] if not allowed_by_the_view(path, own)]
    assert strangers == []
    assert census["connected"] == []
    hidden = [settings.STATE_DIR, *settings.E31_DATA_ROOTS, *settings.E31_OUTPUT_ROOTS, *map(Path, secrets)]
    for path in hidden:
        assert not any(seen == str(path) or seen.startswith(f"{path}/") for seen in census["seen"]), path
    assert {"/usr/bin", "/etc/passwd", "/etc/ld.so.cache", "/proc/self", "/tmp"} <= set(census["seen"])


@pytest.mark.parametrize("live_pool", [{"roots_outside_tmp": True}], indirect=True)
def test_a_job_reads_neither_roots_nor_secret_files(live_pool, member, settings):
    """Reproduction 4: another team's results under an output root outside /tmp, and the *_FILE secrets."""
    other_team = settings.E31_OUTPUT_ROOTS[0] / "other-team"
    other_team.mkdir()
    (other_team / "results.txt").write_text("another team's results")
    targets = {
        "results": str(other_team / "results.txt"),
        "secret_key": live_pool.env["SECRET_KEY_FILE"],
        "database_url": live_pool.env["DATABASE_URL_FILE"],
    }
    probe = f"""
import json
out = {{}}
for name, path in {targets!r}.items():
    try:
        out[name] = open(path).read()
    except OSError as exc:
        out[name] = type(exc).__name__
print(json.dumps(out))
"""
    seen = report(wait_for_state(submit(member, py(probe)).id, "released"))
    assert seen == dict.fromkeys(targets, "FileNotFoundError")
    assert all(os.path.exists(path) for path in targets.values())  # all there on the host, all along


SPANNING_PROBE = """
import json, os, socket, struct, sys, time
targets = json.loads(sys.argv[1])
gateway = next(socket.inet_ntoa(struct.pack('<I', int(f[2], 16))) for f in (l.split() for l in open('/proc/net/route').readlines()[1:]) if f[1] == '00000000')
out = {'rank': os.environ['E31_NODE_RANK'], 'coordinator': os.environ['E31_COORDINATOR'], 'tried': {}}
for name, host, port in [*targets, ('console via gateway', gateway, targets[0][2]), ('postgresql via gateway', gateway, 5432), ('redis via gateway', gateway, 6379)]:
    s = socket.socket()
    s.settimeout(1.5)
    try:
        s.connect((host, port)); s.sendall(b'GET /healthz HTTP/1.0\\r\\n\\r\\n'); out['tried'][name] = 'reached: ' + s.recv(40).decode(errors='replace')
    except OSError as exc:
        out['tried'][name] = type(exc).__name__
if os.environ['E31_NODE_RANK'] == '0':
    server = socket.socket(); server.bind(('0.0.0.0', 29500)); server.listen(1); server.settimeout(60)
    peer, _ = server.accept(); out['from_peer'] = peer.recv(64).decode()
else:
    for _ in range(120):
        try:
            s = socket.create_connection((os.environ['E31_COORDINATOR'], 29500), timeout=1); s.sendall(b'hello from rank 1'); break
        except OSError:
            time.sleep(0.5)
open(os.environ['E31_OUTPUT_DIR'] + '/probe.json', 'w').write(json.dumps(out))
"""


class StandInConsole(http.server.BaseHTTPRequestHandler):
    """Listens on every address of the node, as a console behind ``--bind 0.0.0.0`` would."""

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def test_parts_of_a_spanning_job_reach_each_other_and_nothing_else(live_pool, member, settings):
    """Reproduction 3: both parts fetch the console's /healthz, PostgreSQL, Redis and another job's part."""
    console = http.server.ThreadingHTTPServer(("0.0.0.0", 0), StandInConsole)
    threading.Thread(target=console.serve_forever, daemon=True).start()
    port = console.server_address[1]
    nodes = {n.name: n for n in Node.objects.filter(name__in=live_pool.nodes)}
    other = network.plan(subnet=settings.E31_JOB_SUBNET, key=f"o{live_pool.tag}xyz",
                         slot=nodes[live_pool.nodes[1]].network_slot, gpu_indices=[63], peers=[(nodes[live_pool.nodes[1]].network_slot, [63])])  # fmt: skip
    network.wire(other)
    listener = subprocess.Popen(["ip", "netns", "exec", other.namespace, sys.executable, "-c",
                                 "import socket,time; s=socket.socket(); s.bind(('0.0.0.0', 7000)); s.listen(8); time.sleep(300)"])  # fmt: skip
    targets = [("console on loopback", "127.0.0.1", port), ("postgresql", "127.0.0.1", 5432),
               ("redis", "127.0.0.1", 6379), ("another job's part", other.address, 7000)]  # fmt: skip
    targets += [("console on the node's address", ip, port) for ip in node_addresses()]
    try:
        job = wait_for_state(
            submit(member, [*py(SPANNING_PROBE), json.dumps(targets)], gpus=8).id, "released", timeout=120
        )
        assert job.end_reason == "succeeded", job.log_tail
        wait_for(lambda: Job.objects.get(id=job.id).delivered_at, timeout=60, what="delivery")
    finally:
        listener.kill()
        network.unwire(other)
        console.shutdown()
    delivered = settings.E31_OUTPUT_ROOTS[0] / "vision" / "out" / f"{job.id}-{job.attempt}"
    seen = [json.loads((delivered / f"rank{r}" / "probe.json").read_text()) for r in (0, 1)]
    assert seen[0]["from_peer"] == "hello from rank 1"  # the parts reach each other
    assert seen[0]["coordinator"] == seen[1]["coordinator"] != nodes[live_pool.nodes[0]].address
    for part in seen:
        assert not [name for name, result in part["tried"].items() if result.startswith("reached")], part[
            "tried"
        ]
        assert part["tried"]["console on loopback"] == "ConnectionRefusedError"  # its own loopback, empty
        assert part["tried"]["another job's part"] == "TimeoutError"  # dropped by the node's filter
        assert part["tried"]["console via gateway"] == "TimeoutError"


def node_addresses() -> list[str]:
    shown = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "scope", "global"], capture_output=True, text=True
    )
    return [
        line.split()[3].split("/")[0]
        for line in shown.stdout.splitlines()
        if not line.split()[1].startswith("e31")
    ]
