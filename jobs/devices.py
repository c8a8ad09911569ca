"""The GPUs a job sees: its allocated device nodes, the driver's control devices, its driver libraries.

Bubblewrap binds exactly those nodes into the job's fresh /dev, from ``E31_DEVICE_ROOT`` (``/dev``;
tests point it at fake nodes). Where the devices cgroup exists (v1 here: cgroup v2 has no devices
file, it filters with BPF programs), the attempt gets a group that allows the standard devices
and those nodes only, as Slurm's ConstrainDevices does, so no other GPU opens even through a node
the job could see. A job cannot create device nodes in the first place: it holds no capability
outside its user namespace.
"""

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from jobs import cgroups

CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
# What bubblewrap's minimal /dev holds: null, zero, full, random, urandom and tty. Not ptmx (5:2) nor the ptys
# (136:*): every devpts draws on the node's one kernel.pty.max, and a job has no terminal (the sandbox covers its
# /dev/pts, on cgroup v2 nodes too; here a pty node that reached it anyway opens to EPERM).
STANDARD_DEVICES = ("c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm", "c 5:0 rwm")
DEVICES_CGROUP = Path("/sys/fs/cgroup/devices")
DRIVER_LIBRARIES = re.compile(r"^\s*(libcuda[^ ]*|libnvidia-ml[^ ]*) .*=> (\S+)$")
DRIVER_DIRS = (Path("/usr/local/nvidia/lib64"),)


def gpu_nodes(root: Path, indices: Sequence[int]) -> tuple[Path, ...]:
    """The allocated GPUs' nodes and the control devices present under ``root``."""
    names = [f"nvidia{i}" for i in indices] + list(CONTROL_DEVICES)
    return tuple(root / name for name in names if (root / name).exists())


def visible_devices(indices: Sequence[int], uuids: Mapping[int, str]) -> str:
    """CUDA_VISIBLE_DEVICES: UUIDs (by device index), right however the devices enumerate inside;
    indices for virtual GPUs, which have none."""
    if uuids and all(i in uuids for i in indices):
        return ",".join(uuids[i] for i in indices)
    return ",".join(map(str, indices))


def constrain(name: str, nodes: Sequence[Path]) -> Path | None:
    """An attempt's devices group allowing only the standard devices and ``nodes``; its cgroup.procs.

    None where there is no devices hierarchy to use (cgroup v2 only, or an agent that is not root).
    """
    if not DEVICES_CGROUP.is_dir() or os.geteuid() != 0:
        return None
    group = DEVICES_CGROUP / "e31" / name
    group.mkdir(parents=True, exist_ok=True)
    (group / "devices.deny").write_text("a")
    for rule in (*STANDARD_DEVICES, *map(_rule, nodes)):
        (group / "devices.allow").write_text(rule)
    return group / "cgroup.procs"


def constrained_names() -> list[str]:
    """The attempts (by key) holding a devices group on this machine, whichever agent made them."""
    parent = DEVICES_CGROUP / "e31"
    return sorted(p.name for p in parent.iterdir() if p.is_dir()) if parent.is_dir() else []


def remove_left(name: str) -> None:
    """Removes a devices group an agent that died left, KILLing whatever of its attempt still runs in it."""
    hierarchy = cgroups.Hierarchy("devices", 1, DEVICES_CGROUP, Path("."))
    cgroups.AttemptGroup({"devices": hierarchy}, prefix="e31", name=name).remove(timeout_s=1)


def release(name: str) -> None:
    """Removes the attempt's devices group once its processes are gone."""
    try:
        (DEVICES_CGROUP / "e31" / name).rmdir()
    except OSError:  # gone already, or never made (no devices hierarchy)
        pass


def driver_libraries() -> tuple[Path, ...]:
    """The host's libcuda and libnvidia-ml (from the loader's cache) and NVIDIA's own library folder."""
    found: list[Path] = [d for d in DRIVER_DIRS if d.is_dir()]
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=20).stdout
    except OSError:
        return tuple(found)
    for line in listing.splitlines():
        if match := DRIVER_LIBRARIES.match(line):
            found.append(Path(match.group(2)))
    return tuple(dict.fromkeys(found))


def _rule(node: Path) -> str:
    info = node.stat()
    kind = "c" if node.is_char_device() else "b"
    return f"{kind} {os.major(info.st_rdev)}:{os.minor(info.st_rdev)} rwm"
