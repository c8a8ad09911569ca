"""Per-attempt cgroups: what one job may consume of its node (memory without swap, CPU, processes).

Each controller is taken where the kernel offers it: cgroup v2 when the v2 mount lists it in
``cgroup.controllers``, else its v1 hierarchy (``/sys/fs/cgroup/<controller>``). Machines mix
both: some mount v1 for memory, cpu and pids with an almost empty v2 beside them, others are
v2 only. An attempt's groups sit below the agent's own group, so an operator's limit on the
agent bounds every job it runs. The job's first process joins them before it execs (``join``,
called between fork and exec), so nothing the job starts escapes them.
"""

import errno
import logging
import os
import re
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CONTROLLERS = ("memory", "cpu", "pids")
CFS_PERIOD_US = 100_000
ROOT = Path("/sys/fs/cgroup")
SELF = Path("/proc/self/cgroup")


class SharedGroup(OSError):
    """v2 delegates no controller below a group holding processes, and the agent's holds others besides it."""


@dataclass(frozen=True)
class Hierarchy:
    """Where one controller lives: its mount, its version, and the agent's own group in it."""

    controller: str
    version: int
    mount: Path
    own: Path  # the agent's group, relative to the mount (``.`` at the root)

    def parent(self, prefix: str) -> Path:
        return self.mount / self.own / prefix


@dataclass(frozen=True)
class Limits:
    """One attempt's bounds; a memory or CPU figure of 0 is not known, and that controller stays unset."""

    memory_bytes: int
    cpus: float
    pids: int


def detect(*, root: Path = ROOT, self_cgroup: Path = SELF) -> dict[str, Hierarchy]:
    """The hierarchy that serves each controller here (v2 preferred where enabled); absent if none."""
    own = own_groups(self_cgroup)
    v2 = v2_mount(root)
    offered = set(_read(v2 / "cgroup.controllers").split()) if v2 else set()
    found: dict[str, Hierarchy] = {}
    for controller in CONTROLLERS:
        if v2 and controller in offered:
            found[controller] = Hierarchy(controller, 2, v2, Path(own.get("", "/").lstrip("/") or "."))
        elif (root / controller / "cgroup.procs").exists():
            relative = own.get(controller, "/").lstrip("/") or "."
            found[controller] = Hierarchy(controller, 1, root / controller, Path(relative))
    return found


def v2_mount(root: Path) -> Path | None:
    """The unified (v2) mount: the root itself on v2-only machines, else ``unified`` beside v1."""
    for candidate in (root, root / "unified"):
        if (candidate / "cgroup.controllers").exists():
            return candidate
    return None


def own_groups(self_cgroup: Path = SELF) -> dict[str, str]:
    """controller -> the path of this process's group (``""`` is the v2 entry), from /proc/self/cgroup."""
    groups: dict[str, str] = {}
    for line in _read(self_cgroup).splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            groups[name] = path
    return groups


def describe(hierarchies: Mapping[str, Hierarchy]) -> str:
    """For the pool page: 'memory v1, cpu v1, pids v1', or what is missing."""
    parts = [
        f"{c} v{hierarchies[c].version}" if c in hierarchies else f"{c} unavailable" for c in CONTROLLERS
    ]
    return ", ".join(parts)


class AttemptGroup:
    """The cgroups of one attempt: created with its limits, joined before exec, removed after."""

    def __init__(self, hierarchies: Mapping[str, Hierarchy], *, prefix: str, name: str) -> None:
        self.hierarchies = dict(hierarchies)
        self.prefix = prefix
        self.dirs = {c: h.parent(prefix) / name for c, h in self.hierarchies.items()}

    def create(self, limits: Limits) -> None:
        """Makes each group and writes its limits; OSError if the kernel refuses (the attempt must not run unbounded)."""
        for controller, hierarchy in self.hierarchies.items():
            if hierarchy.version == 2:
                _enable_v2(hierarchy, self.prefix)
            self.dirs[controller].mkdir(parents=True, exist_ok=True)
        for controller, path in self.dirs.items():
            version = self.hierarchies[controller].version
            for filename, value in _settings(controller, version, limits, path):
                _write(path / filename, value)

    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a new process writes its pid to (one per distinct group)."""
        return sorted({str(path / "cgroup.procs") for path in self.dirs.values()})

    def oom_kills(self) -> int:
        """How many processes of this attempt the kernel's OOM killer ended for the memory limit."""
        memory = self.hierarchies.get("memory")
        if memory is None:
            return 0
        filename = "memory.events" if memory.version == 2 else "memory.oom_control"
        return _counter(_read(self.dirs["memory"] / filename), "oom_kill")

    def remove(self, *, timeout_s: float = 5.0) -> None:
        """KILLs whatever of the attempt is still alive (even what left its session) and removes the groups."""
        deadline = time.monotonic() + timeout_s
        for path in set(self.dirs.values()):
            while path.exists():
                _kill_members(path)
                try:
                    path.rmdir()
                except OSError as exc:
                    if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY) or time.monotonic() > deadline:
                        log.warning("could not remove cgroup %s: %s", path, exc)
                        break
                    time.sleep(0.05)


def remove_stale(hierarchies: Mapping[str, Hierarchy], *, prefix: str, node: str) -> list[str]:
    """Removes the attempt groups (``<node>-<job>-<attempt>``) an agent that died left (its jobs died with it)."""
    mine = re.compile(rf"{re.escape(node)}-[0-9]+-[0-9]+")
    removed = []
    for hierarchy in hierarchies.values():
        parent = hierarchy.parent(prefix)
        children = parent.iterdir() if parent.is_dir() else ()
        stale = sorted(p.name for p in children if p.is_dir() and mine.fullmatch(p.name))
        for name in stale:
            AttemptGroup({hierarchy.controller: hierarchy}, prefix=prefix, name=name).remove(timeout_s=1)
            removed.append(f"{hierarchy.controller}:{name}")
    return removed


def join(procs_files: Iterable[str]) -> None:
    """Moves the calling process into the groups: run between fork and exec, so only os calls."""
    pid = str(os.getpid()).encode()
    for filename in procs_files:
        fd = os.open(filename, os.O_WRONLY)
        try:
            os.write(fd, pid)
        finally:
            os.close(fd)


def _settings(controller: str, version: int, limits: Limits, path: Path) -> list[tuple[str, str]]:
    if (controller == "memory" and limits.memory_bytes <= 0) or (controller == "cpu" and limits.cpus <= 0):
        return []
    quota = max(1000, round(limits.cpus * CFS_PERIOD_US))
    if controller == "memory" and version == 1:
        # The limit first: memsw (memory + swap) may never be below it. Swappiness 0 and memsw equal
        # to the limit mean the job cannot page its way around its memory.
        values = [("memory.limit_in_bytes", str(limits.memory_bytes))]
        if (path / "memory.memsw.limit_in_bytes").exists():
            values.append(("memory.memsw.limit_in_bytes", str(limits.memory_bytes)))
        if (path / "memory.kmem.tcp.limit_in_bytes").exists():
            # v1 charges socket buffers to the group only once this is set: unset, a job queued unread data on its
            # sockets past its limit, in the node's one pool of TCP memory, until every socket there was refused.
            values.append(("memory.kmem.tcp.limit_in_bytes", str(limits.memory_bytes)))
        return [*values, ("memory.swappiness", "0")]
    if controller == "memory":
        values = [("memory.max", str(limits.memory_bytes))]
        if (path / "memory.swap.max").exists():
            values.append(("memory.swap.max", "0"))
        return [*values, ("memory.oom.group", "1")]
    if controller == "cpu" and version == 1:
        shares = max(2, round(1024 * limits.cpus))
        return [("cpu.shares", str(shares)), ("cpu.cfs_period_us", str(CFS_PERIOD_US)),
                ("cpu.cfs_quota_us", str(quota))]  # fmt: skip
    if controller == "cpu":
        weight = min(10_000, max(1, round(100 * limits.cpus)))
        return [("cpu.weight", str(weight)), ("cpu.max", f"{quota} {CFS_PERIOD_US}")]
    return [("pids.max", str(limits.pids))]


def _enable_v2(hierarchy: Hierarchy, prefix: str) -> None:
    """Delegates the controller down to ``<own>/<prefix>`` (v2 needs it enabled in every parent).

    v2 refuses controllers below a group that holds processes (other than the root): the agent
    then moves itself into a leaf ``<own>/agent`` first, as a delegated service is expected to.
    """
    own = hierarchy.mount / hierarchy.own
    try:
        _write(own / "cgroup.subtree_control", f"+{hierarchy.controller}")
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
        leaf = own / "agent"
        leaf.mkdir(exist_ok=True)
        _write(leaf / "cgroup.procs", str(os.getpid()))
        try:
            _write(own / "cgroup.subtree_control", f"+{hierarchy.controller}")
        except OSError as again:
            if again.errno != errno.EBUSY:
                raise
            raise SharedGroup(
                errno.EBUSY,
                f"the agent's cgroup /{hierarchy.own} holds other processes, and v2 delegates no controller "
                "below those: give the agent a group of its own (systemd: Delegate=yes)",
            ) from again
    (own / prefix).mkdir(exist_ok=True)
    _write(own / prefix / "cgroup.subtree_control", f"+{hierarchy.controller}")


def _kill_members(path: Path) -> None:
    kill_file = path / "cgroup.kill"  # v2 (5.14+): the kernel kills the whole group at once
    if kill_file.exists():
        _write(kill_file, "1")
        return
    for pid in _read(path / "cgroup.procs").split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _counter(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, value: str) -> None:
    path.write_text(value)
