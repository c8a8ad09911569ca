"""Builds and controls the isolated process a job runs in.

With bubblewrap: a read-only root, a private /tmp, /proc of its own PID namespace, no network,
an empty environment but for the declared variables, the platform's state directories hidden
under empty tmpfs mounts, and only the attempt's own directory writable. Without bubblewrap the
agent refuses to start unless an operator allowed the unsandboxed mode, which the pool page labels.
"""

import ctypes
import functools
import os
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

if TYPE_CHECKING:
    from jobs.models import Allocation

from jobs import cgroups

BUBBLEWRAP = "bubblewrap"
UNSANDBOXED = "none"
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class AttemptDirs:
    root: Path
    work: Path
    output: Path
    data: Path

    def create(self) -> None:
        for path in (self.work, self.output):
            path.mkdir(parents=True, exist_ok=True)


def agent_root(node_name: str) -> Path:
    return settings.E31_AGENT_ROOT / node_name


def attempt_dirs(allocation: "Allocation") -> AttemptDirs:
    """Where a part of an attempt runs and seals on its node; delivery reads its outputs from here."""
    root = agent_root(allocation.node.name) / "jobs" / f"{allocation.job_id}-{allocation.attempt}"
    return AttemptDirs(
        root=root,
        work=root / "work",
        output=root / "output",
        data=settings.E31_STAGING_ROOT / str(allocation.job_id),
    )


def available_mode() -> str:
    """'bubblewrap' when bwrap runs here, else '' (the caller decides whether unsandboxed is allowed)."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return ""
    probe = subprocess.run(
        [bwrap, "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"],
        capture_output=True,
        timeout=20,
    )
    return BUBBLEWRAP if probe.returncode == 0 else ""


def command(
    *, argv: Sequence[str], env: dict[str, str], dirs: AttemptDirs, workdir: str, mode: str,
    hidden: Sequence[Path], share_network: bool = False,
) -> list[str]:  # fmt: skip
    """The full command line that runs ``argv`` inside the sandbox (or as is, when unsandboxed)."""
    if mode != BUBBLEWRAP:
        return list(argv)
    cmd = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session"]
    if share_network:  # processes of a multi-node job must reach their coordinator
        cmd.append("--share-net")
    cmd += ["--ro-bind", "/", "/", "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]
    for path in _outermost(hidden):
        cmd += ["--tmpfs", str(path)]
    cmd += ["--bind", str(dirs.root), str(dirs.root)]
    if dirs.data.exists():
        cmd += ["--ro-bind", str(dirs.data), str(dirs.data)]
    cmd.append("--clearenv")
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    cmd += ["--chdir", str(dirs.work / workdir if workdir else dirs.work), "--", *argv]
    return cmd


def _outermost(paths: Sequence[Path]) -> list[Path]:
    """Hide each tree once: a path inside another hidden one needs no mount of its own."""
    ordered = sorted({p.resolve() for p in paths if p.exists()}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in ordered:
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return kept


def launch(
    cmd: list[str], *, env: dict[str, str], cwd: Path, mode: str, cgroup_procs: Sequence[str] = ()
) -> subprocess.Popen:
    """Starts the job in a new session (its own process group), stdout and stderr on one pipe.

    The child joins the attempt's cgroups (``cgroup_procs``) before it execs, so everything the job
    ever starts is bounded. Python runs ``preexec_fn`` after Popen's own ``user=``/``group=``
    switch, so the uid is dropped later (by bwrap or setpriv), never there: the join needs root.
    """
    return subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=env if mode != BUBBLEWRAP else {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        start_new_session=True,
        preexec_fn=functools.partial(_child_limits, tuple(cgroup_procs)),
    )


def _child_limits(cgroup_procs: tuple[str, ...]) -> None:
    cgroups.join(cgroup_procs)
    # Die with the agent even unsandboxed, and never write core dumps into someone's directory.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), so TERM reaches the job inside bwrap's namespace."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def terminate(proc: subprocess.Popen, *, grace_s: float, mode: str) -> int:
    """TERM to the job and everything it started, then KILL after the grace period; returns the exit code.

    Under bubblewrap the direct child is bwrap itself: TERM goes to the processes inside it, since
    killing bwrap first would KILL them at once (--die-with-parent) and skip their grace period.
    """
    inside = descendants(proc.pid) if mode == BUBBLEWRAP else [proc.pid, *descendants(proc.pid)]
    _send(inside, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    kill_tree(proc)
    return proc.wait()


def kill_tree(proc: subprocess.Popen) -> None:
    """KILL the process group and every descendant, including children that outlive the job."""
    _send([*descendants(proc.pid), proc.pid], signal.SIGKILL)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _send(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
