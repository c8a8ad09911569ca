"""What a node agent that died left on its machine, removed when an agent of the same node starts again.

An agent SIGKILLed (or crashed) mid-job never ran its parts' clean-up: their network namespaces,
veth links and nftables tables, their devices groups and attempt cgroups, and job processes that
outlived it. The node's next agent removes them before it serves a job: every part the node held is
lost at that moment anyway (``nodes.register_node``). Agents of other nodes may share the machine,
so only this node's objects go: those named by a key of one of its own allocations, the cgroups
named after it, and processes under its own uid range (agents sharing a machine have disjoint ones).
Attempt directories and their mounted spaces stay: the retention sweep removes them like any other.
"""

import hashlib
import os
import signal
from pathlib import Path

from jobs import cgroups, devices, limits, network, sandbox
from jobs.models import Allocation


def part_key(node_name: str, allocation_id: int) -> str:
    """Names a part's objects on the host; it hashes the node too, so pools sharing a machine never clash."""
    return hashlib.sha256(f"{node_name}:{allocation_id}".encode()).hexdigest()[:10]


def sweep(*, node_name: str, uids: sandbox.UidRange | None) -> list[str]:
    """Removes what earlier agents of ``node_name`` left; what was removed, for the agent's start-up line."""
    if os.geteuid() != 0:  # an unprivileged agent makes none of these, and its jobs run under its own uid
        return []
    removed = [f"process {pid}" for pid in kill_uid_range(uids)] if uids else []
    removed += cgroups.remove_stale(limits.hierarchies(), prefix=limits.PREFIX, node=node_name)
    for key in sorted(own_keys(node_name, network.wired_keys() | set(devices.constrained_names()))):
        devices.remove_left(key)
        network.unwire_key(key)
        removed.append(f"part {key}")
    return removed


def own_keys(node_name: str, found: set[str]) -> set[str]:
    """Which of the keys ``found`` on the machine name parts this node started (none read when none found)."""
    if not found:
        return set()
    started = Allocation.objects.filter(node__name=node_name, started_at__isnull=False)
    ids = started.values_list("id", flat=True).iterator(chunk_size=10_000)
    return {key for allocation_id in ids if (key := part_key(node_name, allocation_id)) in found}


def kill_uid_range(uids: sandbox.UidRange, proc: Path = Path("/proc")) -> list[int]:
    """KILLs every process running under one of the agent's job uids: no attempt of its runs yet.
    A zombie has finished already (a machine whose pid 1 reaps nothing keeps bubblewrap's): not counted."""
    killed = []
    for entry in proc.iterdir():
        if (
            entry.name.isdigit()
            and uids.base <= _uid(entry) < uids.base + uids.count
            and not _finished(entry)
        ):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                continue
            killed.append(int(entry.name))
    return killed


def _finished(entry: Path) -> bool:
    try:
        return "\nState:\tZ" in (entry / "status").read_text()
    except OSError:  # gone
        return True


def _uid(entry: Path) -> int:
    """The process's effective uid (-1 once it is gone)."""
    try:
        status = (entry / "status").read_text()
    except OSError:
        return -1
    line = next((line for line in status.splitlines() if line.startswith("Uid:")), "Uid: -1 -1")
    return int(line.split()[2])
