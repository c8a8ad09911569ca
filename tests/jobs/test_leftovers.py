"""An agent starting again removes what its node's earlier agent left on the machine when it was killed
mid-job, and nothing of another node's: real namespaces, links, tables, groups and processes (as root)."""

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from django.utils import timezone

from jobs import devices, leftovers, network, sandbox
from jobs.models import Allocation
from tests import machine
from tests.factories import JobFactory, NodeFactory

pytestmark = [pytest.mark.django_db, machine.needs(root=True)]
DEVICES_CGROUP = machine.needs(devices_cgroup=True)  # the parts left behind hold a devices group
OWN_UIDS, OTHER_UIDS = sandbox.UidRange(3_910_000, 8), sandbox.UidRange(3_910_008, 8)


def _left_by_a_killed_agent(node) -> str:
    """A started part's namespace, veth pair, nftables table and devices group, as ``wire``/``constrain`` make them."""
    job = JobFactory(state="running", attempt=1)
    now = timezone.now()
    allocation = Allocation.objects.create(
        job=job, attempt=1, node=node, gpu_indices=[0], rented_at=now, started_at=now
    )
    key = leftovers.part_key(node.name, allocation.id)
    net = network.plan(subnet="100.127.0.0/16", key=key, slot=0, gpu_indices=[0], peers=[(0, [0])])
    network._make(net)
    devices.constrain(key, ())
    return key


def _host_objects(key: str) -> set[str]:
    found = set()
    if key in network.wired_keys():
        found.add("network")
    if key in devices.constrained_names():
        found.add("devices")
    return found


@pytest.fixture
def two_nodes():
    suffix = uuid.uuid4().hex[:6]  # other sessions' tests may share this machine
    own, other = NodeFactory(name=f"sweep-{suffix}"), NodeFactory(name=f"sweep-{suffix}-2")
    keys = {"own": _left_by_a_killed_agent(own), "other": _left_by_a_killed_agent(other)}
    yield own, keys
    for key in keys.values():
        network.unwire_key(key)
        devices.remove_left(key)


def _sleep_as(uid: int) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"], user=uid, group=uid)


@DEVICES_CGROUP
def test_an_agent_starting_removes_its_nodes_leftover_parts_and_leaves_another_nodes(two_nodes):
    own, keys = two_nodes
    assert _host_objects(keys["own"]) == _host_objects(keys["other"]) == {"network", "devices"}
    removed = leftovers.sweep(node_name=own.name, uids=None)
    assert f"part {keys['own']}" in removed and f"part {keys['other']}" not in removed
    assert _host_objects(keys["own"]) == set()
    assert _host_objects(keys["other"]) == {"network", "devices"}
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert f"e31_{keys['own']}" not in tables and f"e31_{keys['other']}" in tables


def test_a_job_process_that_outlived_its_agent_is_killed_and_another_agents_job_is_not():
    own_job, other_job = _sleep_as(OWN_UIDS.base + 3), _sleep_as(OTHER_UIDS.base)
    try:
        killed = leftovers.kill_uid_range(OWN_UIDS)
        assert own_job.wait(timeout=10) == -9
        assert own_job.pid in killed and other_job.pid not in killed
        assert other_job.poll() is None
    finally:
        own_job.kill()
        other_job.kill()
        other_job.wait()


@DEVICES_CGROUP
def test_an_unprivileged_agent_sweeps_nothing(monkeypatch):
    node = NodeFactory(name=f"sweep-{uuid.uuid4().hex[:6]}")
    key, job = _left_by_a_killed_agent(node), _sleep_as(OWN_UIDS.base)
    try:
        monkeypatch.setattr(leftovers.os, "geteuid", lambda: 1000)
        assert leftovers.sweep(node_name=node.name, uids=OWN_UIDS) == []
        assert _host_objects(key) == {"network", "devices"}
        assert job.poll() is None
    finally:
        job.kill()
        job.wait()
        network.unwire_key(key)
        devices.remove_left(key)


def test_a_machine_without_ip_or_nft_has_nothing_wired_and_its_agent_still_starts(monkeypatch, tmp_path):
    # Seen on a GPU machine with neither tool: the start-up sweep raised FileNotFoundError and the agent died.
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(leftovers.os, "geteuid", lambda: 0)
    monkeypatch.setattr(network.os, "geteuid", lambda: 0)
    assert network.wired_keys() == set()
    network.unwire_key("0123456789")
    assert leftovers.sweep(node_name="gpu-01", uids=None) == []
    assert network.refusal().startswith(
        "cannot isolate a job's network here: [Errno 2] No such file or directory"
    )


def test_a_finished_process_not_yet_reaped_is_not_reported_as_left_behind():
    # Seen on a GPU machine whose pid 1 reaps nothing: the start-up probe's bubblewrap stayed a zombie under
    # the first job uid, and the agent's first line said it had removed "process 650" an earlier agent left.
    uids = sandbox.UidRange(
        3_910_016, 1
    )  # a range of its own: the sweep must not touch the other tests' jobs
    finished = subprocess.Popen(["true"], user=uids.base, group=uids.base)
    try:
        os.waitid(os.P_PID, finished.pid, os.WEXITED | os.WNOWAIT)  # it has exited; left unreaped
        assert _state(finished.pid) == "Z"
        assert leftovers.kill_uid_range(uids) == []
    finally:
        finished.wait()


def _state(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(line.split()[1] for line in status.splitlines() if line.startswith("State:"))
