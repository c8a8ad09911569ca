"""Builds and controls the isolated process a job runs in.

A job is a stranger on the node. With bubblewrap it runs under an unprivileged uid of its own (one
per attempt, from the agent's range, so the host's ``ps`` and file owners show it), in new user,
PID, IPC, UTS and network namespaces, and sees an allow-listed view of the node (``VIEW`` below:
the system's programs and libraries read-only, a minimal /etc with a synthesized passwd/group, its
own /proc, /dev and /tmp, its directories, its data and its GPUs) and nothing else: no host
sockets, no state directory, no data or output root, no secret file. Bubblewrap mounts every bind
nosuid, and the job holds no capability outside its user namespace, so a setuid file it writes
grants nothing. Without bubblewrap the agent refuses to start unless an operator allowed the
unsandboxed mode, which the pool page labels.
"""

import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import resource
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from django.conf import settings

if TYPE_CHECKING:
    from jobs.models import Allocation

from jobs import cgroups, network, syscalls

BUBBLEWRAP = "bubblewrap"
UNSANDBOXED = "none"
# In a node's limits when its agent is not root: it cannot switch uids, so every job runs as the agent.
SHARED_UID = "jobs share the agent's uid"
# The pool page's word for an agent whose jobs can write their OOM score back down (``floors_oom_score``).
NO_OOM_FLOOR = "no OOM score floor (agent lacks CAP_SYS_RESOURCE)"
CAP_SYS_RESOURCE = 24
PR_SET_PDEATHSIG = 1
CLONE_NEWNET = 0x40000000
# keyctl(2): the syscall's number by architecture (glibc has no wrapper), and joining a new anonymous session keyring.
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "ppc64le": 271, "s390x": 280}
KEYCTL_JOIN_SESSION_KEYRING = 1
NETNS_DIR = Path("/run/netns")
# Bubblewrap's own environment. It is the job's process 1, running as the job's uid, so the job reads it in
# /proc/1/environ: nothing of the agent's (its PATH showed /root/.pyenv/...). The job's own is --setenv's.
BUBBLEWRAP_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
# Open files per process of a job, soft and hard alike: it inherited the agent's (20000 on one node, a million
# under systemd's LimitNOFILE=infinity), and 20 processes holding 20,000 eventfds each took 401,187 files of that
# node's fs.file-max, after which every process on it but root's got ENFILE. This bounds a process, and the
# attempt's pids group bounds its processes, but the product (4096 x 65536 with the default E31_ATTEMPT_PIDS,
# 2**28) is far above a kernel-default fs.file-max (a tenth of memory in KiB: 2,466,239 on a 24 GiB node), so it
# alone does not keep one job from the node's count: the agent raises fs.file-max past every attempt's product at
# start (``raise_file_max``), and then what each file costs is kernel memory, charged to the attempt's memory group.
JOB_OPEN_FILES = 65536
FILE_MAX = Path("/proc/sys/fs/file-max")
# Every pid namespace draws on the node's one kernel.pid_max (32,768 by default): the agent raises it past its
# attempts' E31_ATTEMPT_PIDS each, plus these for the node's own processes (``raise_pid_max``).
PID_MAX = Path("/proc/sys/kernel/pid_max")
NODE_PIDS = 32768
# The node's one pool of socket buffer memory, in pages: "min pressure ceiling" (``raise_socket_memory``).
SOCKET_MEMORY = (Path("/proc/sys/net/ipv4/tcp_mem"), Path("/proc/sys/net/ipv4/udp_mem"))
MEMINFO = Path("/proc/meminfo")

# The node as a job sees it, in this one place: what is not listed here does not exist inside.
VIEW = {
    # The system's programs and libraries, read-only (a symlink on the host stays a symlink).
    "system": ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"),
    # The few /etc entries the dynamic loader, Python, TLS and name resolution read, read-only.
    "etc": (
        "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
        "/etc/ssl/certs", "/etc/ssl/openssl.cnf", "/etc/ca-certificates.conf", "/etc/resolv.conf",
        "/etc/hosts", "/etc/host.conf", "/etc/nsswitch.conf", "/etc/gai.conf", "/etc/localtime",
        "/etc/protocols", "/etc/services", "/etc/mime.types", "/etc/python3", "/etc/python3.11",
        "/etc/python3.12",
    ),
    # Written by the agent for each attempt: the job's own user and group, root and nobody.
    "synthesized": ("/etc/passwd", "/etc/group"),
    # Private to the attempt: its PID namespace's /proc, a minimal /dev (plus its GPUs), a fresh /tmp.
    "private": ("/proc", "/dev", "/tmp"),
}  # fmt: skip


@dataclass(frozen=True)
class AttemptDirs:
    root: Path
    work: Path
    output: Path
    data: Path
    checkpoint: Path | None = None  # a pausable job's first part: the directory its attempts hand on

    def create(self, *, owner: int) -> None:
        """The attempt root stays the agent's (job.log lives there); work and output are the job's own."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o711)
        for path in (self.work, self.output):
            path.mkdir(exist_ok=True)
            os.chown(path, owner, owner)
            path.chmod(0o700)  # nobody else on the host enters, so a file left here is the job's alone


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


@dataclass(frozen=True)
class Confinement:
    """What one attempt's process gets beyond the common view: its identity, network, devices, groups."""

    uid: int
    gid: int
    netns: str = ""  # a named network namespace made by the agent; empty: bubblewrap's private loopback
    devices: tuple[Path, ...] = ()  # device nodes bound in under /dev (the allocated GPUs and controls)
    cgroup_procs: tuple[
        str, ...
    ] = ()  # cgroup.procs files the process joins (as root) before it drops privileges
    libraries: tuple[Path, ...] = ()  # the host's GPU driver libraries, bound where the view lacks them


# Inside an image's root, the attempt's own directories and the host's GPU driver libraries appear
# here: the image owns every other path, read-only, so nothing of the host's layout can be mounted
# into its /var or /usr.
IMAGE_MOUNTS = Path("/e31")
# Entries of an image's root that the sandbox makes itself (or synthesizes, under /etc).
IMAGE_PRIVATE = {"proc", "dev", "tmp", "sys", "etc", IMAGE_MOUNTS.name}
IMAGE_SYNTHESIZED_ETC = {"passwd", "group"}


@dataclass(frozen=True)
class ImageView:
    """A job's image as staged: its unpacked root and what its config asks of a run."""

    rootfs: Path
    env: tuple[str, ...] = ()  # KEY=value, as the image's Env lists them
    workdir: str = ""  # the image's WorkingDir, absolute inside the image
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, rootfs: Path, config: dict) -> "ImageView":
        return cls(
            rootfs=rootfs, env=tuple(config.get("Env") or ()), workdir=config.get("WorkingDir") or "",
            entrypoint=tuple(config.get("Entrypoint") or ()), cmd=tuple(config.get("Cmd") or ()),
        )  # fmt: skip

    def argv(self, argv: Sequence[str]) -> list[str]:
        """Entrypoint, then the job's argv in place of the image's Cmd when it gave one (as ``docker run``)."""
        full = [*self.entrypoint, *(argv or self.cmd)]
        if not full:
            raise ValueError("the image declares no Entrypoint or Cmd, and the job gave no argv")
        return full

    def environment(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.env if "=" in item)


def seen_inside(dirs: AttemptDirs, image: ImageView | None) -> AttemptDirs:
    """The attempt's directories as the job sees them: where they are on the host, or under /e31 in an image."""
    if image is None:
        return dirs
    return AttemptDirs(root=dirs.root, work=IMAGE_MOUNTS / "work", output=IMAGE_MOUNTS / "output",
                       data=IMAGE_MOUNTS / "data",
                       checkpoint=IMAGE_MOUNTS / "checkpoint" if dirs.checkpoint else None)  # fmt: skip


def image_library_path(libraries: Sequence[Path]) -> list[str]:
    """Where an image's job finds the host's driver libraries (its LD_LIBRARY_PATH entries)."""
    if not libraries:
        return []
    folders = [str(IMAGE_MOUNTS / "driver" / lib.name) for lib in libraries if lib.is_dir()]
    return [str(IMAGE_MOUNTS / "driver"), *folders]


class UidRange:
    """The uids one agent hands out: one per running attempt, never two attempts at once."""

    def __init__(self, base: int, count: int) -> None:
        if base < 1000 or count < 1:
            raise ValueError("the job uid range starts at 1000 or above and holds at least one uid")
        self.base, self.count = base, count
        self._taken: set[int] = set()
        self._lock = threading.Lock()

    def take(self, seed: int) -> int:
        """A free uid, starting from ``seed`` (an allocation id) so that successive attempts rotate."""
        with self._lock:
            for step in range(self.count):
                uid = self.base + (seed + step) % self.count
                if uid not in self._taken:
                    self._taken.add(uid)
                    return uid
        raise RuntimeError(f"all {self.count} job uids from {self.base} are in use on this node")

    def give_back(self, uid: int) -> None:
        with self._lock:
            self._taken.discard(uid)


class UidRangeTaken(Exception):
    """Another live agent on this machine holds job uids this agent would hand out."""


_CLAIMS: dict[tuple[int, int], int] = {}  # this process's held claims: one lock per range, kept for its life


def claim_uids(uids: UidRange, registry: Path) -> None:
    """Holds this agent's uid range for its lifetime, refusing one that overlaps a live agent's on this machine.

    Two agents handing out one uid would run two teams' jobs as one user, and one agent's start-up sweep
    would kill the other's jobs. Each range is a file in ``registry`` (machine-wide) locked by its agent:
    a lock the kernel drops when the agent dies, however it dies, so a crashed agent's range is free again.
    """
    if (uids.base, uids.count) in _CLAIMS:
        return
    registry.mkdir(mode=0o700, parents=True, exist_ok=True)
    own = registry / f"{uids.base}-{uids.count}"
    fd = os.open(own, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    if not _locked(fd, fcntl.LOCK_EX):
        os.close(fd)
        raise UidRangeTaken(f"another agent on this machine holds job uids {_span(uids.base, uids.count)}")
    for other in registry.iterdir():
        held = _overlapping(other.name, uids)
        if other != own and held and _alive(other):
            os.close(fd)
            raise UidRangeTaken(
                f"job uids {_span(uids.base, uids.count)} overlap {_span(*held)}, held by another agent on this machine"
            )
    _CLAIMS[(uids.base, uids.count)] = fd


def _overlapping(name: str, uids: UidRange) -> tuple[int, int] | None:
    base, _, count = name.partition("-")
    if not (base.isdigit() and count.isdigit()):
        return None
    other = (int(base), int(count))
    return other if other[0] < uids.base + uids.count and uids.base < other[0] + other[1] else None


def _alive(path: Path) -> bool:
    """Whether a live agent holds the range file (a shared lock is refused while it does)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        return not _locked(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)  # and with it any lock taken here


def _locked(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _span(base: int, count: int) -> str:
    return f"{base}-{base + count - 1}"


def refusal(*, probe_uid: int) -> str:
    """Why jobs cannot be sandboxed here ('' when bubblewrap, with the syscall filter, runs a probe as a job)."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return "bubblewrap (bwrap) is not installed (apt-get install bubblewrap)"
    try:
        program = syscalls.filter_fd()
    except syscalls.FilterUnavailable as exc:
        return f"the job syscall filter cannot be built: {exc}"
    except OSError as exc:
        return f"the job syscall filter cannot be handed to bubblewrap: {exc}"
    try:
        probe = subprocess.run(
            [bwrap, "--seccomp", str(program), "--unshare-all", *_system_view(), "--proc", "/proc", "--dev", "/dev",
             "/usr/bin/true"],
            capture_output=True,
            timeout=20,
            env=BUBBLEWRAP_ENV,
            pass_fds=(program,),
            preexec_fn=lambda: _enter(Confinement(uid=probe_uid, gid=probe_uid)),
        )  # fmt: skip
    # A launcher step (a uid, a keyring) failed, as it would for a job.
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the launcher cannot start a job here as uid {probe_uid}: {exc}"
    finally:
        os.close(program)
    if probe.returncode != 0:
        said = probe.stderr.decode(errors="replace").strip()[:300] or "nothing on stderr"
        return f"bubblewrap cannot run a job here (exit {probe.returncode}): {said}"
    return ""


@functools.cache
def disables_userns() -> bool:
    """Whether this bubblewrap can stop a job making user namespaces of its own (0.8 and later)."""
    bwrap = shutil.which("bwrap")
    help_text = (
        subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=20) if bwrap else None
    )
    return help_text is not None and "--disable-userns" in help_text.stdout


def exposed_by_view(paths: Sequence[Path]) -> list[Path]:
    """Those of ``paths`` (state, roots, secret files) that a job would see through the view: must be none."""
    shown = [Path(p) for p in (*VIEW["system"], *VIEW["etc"])]
    return [p for p in paths if any(p.resolve().is_relative_to(s.resolve()) for s in shown if s.exists())]


def untraversable(path: Path) -> Path | None:
    """The first directory on the way to ``path`` that other uids cannot pass through, if any.

    Bubblewrap runs as the job's uid, so it must reach the directories it binds; passing through
    (o+x) is all it needs: the directories themselves stay closed (0700 and 0711).
    """
    path = Path(path).resolve()
    for directory in (*reversed(path.parents), path):
        if directory.exists() and not directory.stat().st_mode & stat.S_IXOTH:
            return directory
    return None


def traversal_refusal(path: Path) -> str:
    """Why job uids could not reach their directories under ``path`` ('' when they can), and the fix."""
    if blocked := untraversable(path):
        return (
            f"job uids cannot pass through {blocked} to reach {path}: allow it (chmod o+x {blocked}); "
            "they still cannot list it, and inside the sandbox only their own directories exist"
        )
    return ""


def passwd_lines(*, uid: int, gid: int, home: Path) -> tuple[str, str]:
    """/etc/passwd and /etc/group as the job sees them: root, the job itself, nobody."""
    passwd = (
        "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
        f"job:x:{uid}:{gid}:e31 job:{home}:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    group = f"root:x:0:\njob:x:{gid}:\nnogroup:x:65534:\n"
    return passwd, group


def command(
    *, argv: Sequence[str], env: dict[str, str], dirs: AttemptDirs, workdir: str, mode: str,
    confinement: Confinement, image: ImageView | None = None, secrets_fd: int | None = None,
) -> list[str]:  # fmt: skip
    """The full command line that runs ``argv`` inside the sandbox (or as is, when unsandboxed).

    With an image, its root is the job's ``/`` (read-only) and its Entrypoint, Cmd and WorkingDir apply.

    Secrets never appear in it: bubblewrap reads their ``--setenv`` arguments from ``secrets_fd``
    (``secret_arguments``), so ``ps`` and ``/proc/*/cmdline`` show only the descriptor's number.
    """
    if mode != BUBBLEWRAP:
        if image is not None:
            raise ValueError("a job's image needs the bubblewrap sandbox, which this node does not run")
        return list(argv)
    cmd = ["bwrap", "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
           "--die-with-parent", "--new-session", "--hostname", "e31-job"]  # fmt: skip
    if disables_userns():
        # No namespaces of its own inside, so no capabilities there either (nf_tables, mounts: the kernel's
        # largest surface for a process that has none outside).
        cmd.insert(2, "--disable-userns")
    if not confinement.netns:  # else the process already joined the namespace the agent wired up
        cmd.append("--unshare-net")
    cmd += _system_view() if image is None else _image_view(image.rootfs)
    cmd += [
        "--ro-bind",
        str(dirs.root / "passwd"),
        "/etc/passwd",
        "--ro-bind",
        str(dirs.root / "group"),
        "/etc/group",
    ]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    # bubblewrap's /dev holds a devpts of its own, but every devpts draws on the node's one kernel.pty.max (a job
    # took 3,071 terminals and another's openpty() failed), and it takes no max= we could give it. A job has no
    # terminal: an empty folder covers it (read-only below), which a job cannot unmount, on any cgroup version.
    cmd += ["--tmpfs", "/dev/pts"]
    for device in confinement.devices:
        cmd += ["--dev-bind", str(device), f"/dev/{device.name}"]
    for library in confinement.libraries:
        if image is not None:
            cmd += ["--ro-bind", str(library), str(IMAGE_MOUNTS / "driver" / library.name)]
        elif not exposed_by_view([library]):
            cmd += ["--ro-bind", str(library), str(library)]
    inside = seen_inside(dirs, image)
    cmd += ["--bind", str(dirs.work), str(inside.work), "--bind", str(dirs.output), str(inside.output)]
    if dirs.data.exists():
        cmd += ["--ro-bind", str(dirs.data), str(inside.data)]
    if dirs.checkpoint and inside.checkpoint:
        cmd += ["--bind", str(dirs.checkpoint), str(inside.checkpoint)]
    cmd += ["--remount-ro", "/"]  # the root that holds the view's mount points: nothing new under / or /etc
    cmd += ["--remount-ro", "/dev/pts"]
    cmd.append("--clearenv")
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    if secrets_fd is not None:
        cmd += ["--args", str(secrets_fd)]
    cmd += ["--chdir", _start_dir(inside, workdir, image), "--", *(image.argv(argv) if image else argv)]
    return cmd


def _start_dir(inside: AttemptDirs, workdir: str, image: ImageView | None) -> str:
    """The job's own workdir when it declared one, else the image's WorkingDir, else its work directory."""
    if workdir:
        return str(inside.work / workdir)
    return (image.workdir if image else "") or str(inside.work)


def _image_view(rootfs: Path) -> list[str]:
    """The image's root as ``/``, read-only: each top-level entry bound (or its symlink made) on bubblewrap's
    own root, so the sandbox can still add /proc, /dev, /tmp, /e31 and the synthesized /etc/passwd and group
    without writing into the cached image. /etc is made here and filled from the image, entry by entry."""
    args = _entries(rootfs, "/", skip=IMAGE_PRIVATE)
    args += ["--dir", "/etc"]
    etc = rootfs / "etc"
    if etc.is_dir() and not etc.is_symlink():
        args += _entries(etc, "/etc/", skip=IMAGE_SYNTHESIZED_ETC)
    return args


def _entries(folder: Path, prefix: str, *, skip: set[str]) -> list[str]:
    args: list[str] = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name in skip:
            continue
        if entry.is_symlink():  # recreated, never followed on the host: it resolves inside the image
            args += ["--symlink", os.readlink(entry.path), prefix + entry.name]
        elif entry.is_dir() or entry.is_file():
            args += ["--ro-bind", entry.path, prefix + entry.name]
    return args


def secret_arguments(secrets: dict[str, str]) -> int:
    """An anonymous in-memory file of bubblewrap arguments (``--setenv NAME VALUE``, NUL-separated).

    Handed to bubblewrap as an inherited descriptor, which it reads and closes before the job starts:
    the values never touch a command line, an environment block on the host or a file on disk. The
    caller closes its own descriptor once bubblewrap is started.
    """
    fd = os.memfd_create("e31-job-secrets", os.MFD_CLOEXEC)
    payload = b"".join(
        b"--setenv\0%s\0%s\0" % (name.encode(), value.encode()) for name, value in secrets.items()
    )
    with open(fd, "wb", closefd=False) as handle:
        handle.write(payload)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def write_identity(dirs: AttemptDirs, *, uid: int, gid: int) -> None:
    """The synthesized /etc/passwd and /etc/group, owned by the agent and bound read-only."""
    passwd, group = passwd_lines(uid=uid, gid=gid, home=dirs.work)
    (dirs.root / "passwd").write_text(passwd)
    (dirs.root / "group").write_text(group)


def _system_view() -> list[str]:
    args: list[str] = []
    for path in (*VIEW["system"], *VIEW["etc"]):
        source = str(network.job_resolv_conf()) if path == "/etc/resolv.conf" else path
        if os.path.islink(path) and path in VIEW["system"]:
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(source):
            args += ["--ro-bind", source, path]
    return args


def launch(
    cmd: list[str],
    *,
    env: dict[str, str],
    cwd: Path,
    mode: str,
    confinement: Confinement,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen:
    """Starts the job in a new session (its own process group), stdout and stderr on one pipe.

    The child joins its cgroups and network namespace as root, then drops to the attempt's uid
    before bubblewrap runs: bubblewrap is not setuid here and makes the user namespace itself, so
    the host sees the job's own uid (a root bwrap with ``--uid`` would map it only inside).

    Every sandboxed job gets the syscall filter (``syscalls``), added here so that no caller can leave it out:
    bubblewrap reads it from an inherited descriptor and loads it just before the job's own program.
    """
    if mode != BUBBLEWRAP:
        return _popen(cmd, env=env, cwd=cwd, confinement=confinement, pass_fds=pass_fds)
    if cmd[0] != "bwrap":
        raise ValueError("a sandboxed job's command is bubblewrap's (sandbox.command)")
    bwrap = shutil.which(cmd[0]) or cmd[0]  # found on the agent's PATH, which bubblewrap itself does not get
    program = syscalls.filter_fd()
    try:
        return _popen(
            [bwrap, "--seccomp", str(program), *cmd[1:]],
            env=BUBBLEWRAP_ENV,
            cwd=cwd,
            confinement=confinement,
            pass_fds=(*pass_fds, program),
        )
    finally:
        os.close(program)


def _popen(
    cmd: list[str], *, env: dict[str, str], cwd: Path, confinement: Confinement, pass_fds: tuple[int, ...]
) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=env,
        start_new_session=True,
        pass_fds=pass_fds,
        preexec_fn=lambda: _enter(confinement),
    )


def _enter(confinement: Confinement) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    cgroups.join(confinement.cgroup_procs)  # resource limits and the devices group bound all it starts
    # Killed first when memory runs out above the job's own group (the agent's, the machine's): a job of many
    # mid-sized processes is never the largest, and the kernel took the agent, and every job of the node with
    # it. Its processes inherit the score; written by an agent with CAP_SYS_RESOURCE it is also their floor
    # (``floors_oom_score``: the pool page says where it is not).
    Path("/proc/self/oom_score_adj").write_text("1000")
    if confinement.netns:
        with open(NETNS_DIR / confinement.netns) as handle:
            if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"cannot join network namespace {confinement.netns}")
    _bound_open_files()
    if os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(confinement.gid, confinement.gid, confinement.gid)
        os.setresuid(confinement.uid, confinement.uid, confinement.uid)
    _own_session_keyring(libc)
    # After the uid change, which clears it: die with the agent, and never dump core into a directory.
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # 1, not 0: where kernel.core_pattern pipes dumps to a program (apport, systemd-coredump), the kernel ignores
    # a limit of 0 and runs that program as root, outside the job's groups, on the job's memory and environment;
    # 1 is its own value for "no dump to a pipe", and below the smallest core file as well.
    resource.setrlimit(resource.RLIMIT_CORE, (1, 1))


def floors_oom_score(status: Path = Path("/proc/self/status")) -> bool:
    """Whether the score of 1000 a job's processes start with (``_enter``) is also their floor: the kernel keeps it
    as one only when written by a process holding CAP_SYS_RESOURCE. Without it (a container's root may lack it) a
    job can write its score back to the agent's, and be no likelier than the agent to be killed when the node runs
    out of memory."""
    for line in status.read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    return False


def _bound_open_files() -> None:
    limit = job_open_files()
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def job_open_files() -> int:
    """JOB_OPEN_FILES, or the agent's own hard limit where that is lower: raising it takes CAP_SYS_RESOURCE,
    which an agent in a container may lack (and a lower one bounds the job as well)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return JOB_OPEN_FILES if hard == resource.RLIM_INFINITY else min(JOB_OPEN_FILES, hard)


def raise_file_max(*, attempts: int, path: Path = FILE_MAX) -> str:
    """Raises the node's one count of open files (fs.file-max) past what ``attempts`` jobs may hold at once, and
    says what it did ('' when it was high enough already).

    On a kernel default, one job took every file of the node and the others' processes got ENFILE (root's alone are
    let past it). Above the jobs' product, a file costs kernel memory, charged to the attempt's memory group, so
    each job stops at its own memory limit instead: a 64 MiB group flooding eventfds was killed at its limit,
    55 MiB of it kernel memory, with the node's count untouched by anyone else's.
    """
    needed = job_open_files() * settings.E31_ATTEMPT_PIDS * max(1, attempts)
    return _raise_count(path, "fs.file-max", needed, unit="files", of=f"its {attempts} attempts may hold")


def raise_pid_max(*, attempts: int, path: Path = PID_MAX) -> str:
    """Raises the node's one count of pids (kernel.pid_max) past what ``attempts`` jobs may start at once, plus
    NODE_PIDS for the node's own, and says what it did ('' when it was high enough already). On the kernel's
    default, eight attempts of E31_ATTEMPT_PIDS (4,096 each) add up to every pid of the node, and then the agent's
    own commands and every other job get EAGAIN from fork."""
    needed = settings.E31_ATTEMPT_PIDS * max(1, attempts) + NODE_PIDS
    return _raise_count(path, "kernel.pid_max", needed, unit="pids", of=f"its {attempts} attempts may start")


def _raise_count(path: Path, name: str, needed: int, *, unit: str, of: str) -> str:
    """Raises one of the node's counts to ``needed`` ``unit`` (what ``of`` says), and says what it did."""
    current = int(path.read_text())
    if current >= needed:
        return ""
    try:
        path.write_text(f"{needed}\n")
    except OSError as exc:
        return (
            f"{name} is {current:,}, below the {needed:,} {unit} {of}, so one job can take every one of the "
            f"node's {unit}; raise it (sysctl -w {name}={needed}): {exc.strerror}"
        )
    return f"raised {name} from {current:,} to {needed:,}, past what {of}"


def raise_socket_memory(*, paths: tuple[Path, ...] = SOCKET_MEMORY, meminfo: Path = MEMINFO) -> list[str]:
    """Lifts the ceiling of the node's one pool of TCP and UDP buffer memory to the node's memory, keeping its
    pressure thresholds, and says what it did (nothing where it was that high already).

    By default the ceiling is about a tenth of memory, and a job whose own memory limit is above it (one GPU's share
    of an eight-GPU node) could queue unread data on its sockets until every socket of the node is refused
    memory, the agent's connections to the database and broker among them (a 96 MiB job queued 239 MiB before
    its group was charged for them, ``tests/jobs/test_socket_memory.py``). Each job's socket
    buffers are charged to its own memory group (``cgroups``), so it stops at its own limit instead."""
    total_kib = next(
        int(line.split()[1]) for line in meminfo.read_text().splitlines() if line.startswith("MemTotal:")
    )
    pages = total_kib * 1024 // os.sysconf("SC_PAGE_SIZE")
    said = []
    for path in filter(Path.exists, paths):  # a kernel without UDP or IPv4 has no pool of it to raise
        low, pressure, ceiling = (int(n) for n in path.read_text().split())
        if ceiling >= pages:
            continue
        try:
            path.write_text(f"{low} {pressure} {pages}\n")
        except OSError as exc:
            said.append(f"{path.name} ({ceiling:,} pages) cannot be raised to {pages:,}: {exc.strerror}")
            continue
        said.append(f"raised {path.name}'s ceiling from {ceiling:,} to {pages:,} pages, the node's memory")
    return said


def _own_session_keyring(libc: ctypes.CDLL) -> None:
    """A new, empty session keyring for the job: an agent started by systemd (or a PAM login) has one of its
    own, which every job would otherwise inherit - a place where one team's job leaves keys another's reads.
    Joined after the uid change, so the keyring is the job's. Where the kernel has no keyrings, or refuses
    keyctl to the agent (a seccomp profile), the job cannot reach one either."""
    number = SYS_KEYCTL.get(os.uname().machine)
    if number is None:
        raise OSError(f"no keyctl syscall number known for {os.uname().machine}")
    if libc.syscall(number, ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), None) < 0:
        error = ctypes.get_errno()
        if error not in (errno.ENOSYS, errno.EPERM):
            raise OSError(error, "cannot give the job a session keyring of its own")


def reown(root: Path) -> None:
    """After the job: its files become the agent's, setuid/setgid bits cleared, before sealing reads them."""
    own_tree(root, uid=os.geteuid(), gid=os.getegid())


def own_tree(root: Path, *, uid: int, gid: int) -> None:
    """Everything under ``root`` owned by ``uid``:``gid``, setuid/setgid bits cleared.

    Walked by directory descriptors, never following a link: a process of the job still alive (a lost
    node's) that swaps a directory for a link to the host's files mid-walk changes nothing outside ``root``.
    """
    _own_entry(str(root), None, uid, gid)
    for _, folders, files, folder_fd in os.fwalk(root, follow_symlinks=False):
        for name in (*folders, *files):
            _own_entry(name, folder_fd, uid, gid)


def _own_entry(name: str, folder_fd: int | None, uid: int, gid: int) -> None:
    try:
        os.chown(name, uid, gid, dir_fd=folder_fd, follow_symlinks=False)
        info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return  # removed meanwhile
    setid = stat.S_ISUID | stat.S_ISGID
    if not (info.st_mode & setid and (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode))):
        return
    # chmod by name would follow a link swapped in since the stat: change the very file opened instead.
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder_fd)
    try:
        os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) & ~setid)
    finally:
        os.close(fd)


class Found(NamedTuple):
    """A process a scan of /proc found: its pid, and when it started (clock ticks after boot), which tells it
    from a later process given the same pid."""

    pid: int
    start: int


def descendants(pid: int) -> list[Found]:
    """Every process below ``pid`` (from /proc), so TERM reaches the job inside bwrap's namespace."""
    children: dict[int, list[Found]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat_fields(int(entry.name))
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(Found(int(entry.name), int(fields[19])))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child.pid)
    return found


def start_ticks(pid: int) -> int:
    """When the process now holding ``pid`` started, in clock ticks after boot (OSError if none does)."""
    return int(_stat_fields(pid)[19])


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command's name (which may hold spaces and brackets): state, ppid, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def terminate(
    proc: subprocess.Popen, *, grace_s: float, mode: str, sig: int = signal.SIGTERM,
    cut_short: Callable[[], bool] = lambda: False, short_grace_s: float = 0.0,
) -> int:  # fmt: skip
    """TERM (or a pausable job's checkpoint signal) to the job and everything it started, then KILL after
    the grace period; returns the exit code. Once ``cut_short`` says so, the grace ends within
    ``short_grace_s``, after a TERM (a checkpoint no longer wanted, or GPUs no longer the job's).

    Under bubblewrap the direct child is bwrap itself: the signal goes to the processes inside it, since
    killing bwrap first would KILL them at once (--die-with-parent) and skip their grace period. Inside,
    bwrap's own init ignores a signal it has no handler for, as the kernel does for a namespace's init.
    """
    _send(_inside(proc, mode), sig)
    deadline, shortened = time.monotonic() + grace_s, False
    while not exited(proc) and time.monotonic() < deadline:
        if not shortened and cut_short():
            shortened, deadline = True, min(deadline, time.monotonic() + short_grace_s)
            if sig != signal.SIGTERM:
                _send(_inside(proc, mode), signal.SIGTERM)
        time.sleep(0.05)
    kill_tree(proc)  # not reaped yet (``exited`` leaves it): its pid and group are still its own
    return proc.wait()


def _inside(proc: subprocess.Popen, mode: str) -> list[Found | int]:
    return descendants(proc.pid) if mode == BUBBLEWRAP else [proc.pid, *descendants(proc.pid)]


def exited(proc: subprocess.Popen) -> bool:
    """Whether the job's process has exited, without reaping it (``Popen.poll`` would): until it is
    reaped its pid, and the process group named by it, cannot be handed to another process."""
    if proc.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped elsewhere
        return True


def reap(proc: subprocess.Popen) -> int:
    """Wait for the job's process to exit, KILL what it left behind (``kill_tree``), then reap it."""
    if proc.returncode is None:
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        kill_tree(proc)
    return proc.wait()


def kill_tree(proc: subprocess.Popen) -> None:
    """KILL the process group and every descendant, including children that outlive the job.

    Only while the process is not reaped: once it is, its pid (and group id) may already belong to
    another process, another team's attempt among them, which must never be signalled.
    """
    if proc.returncode is not None:
        return
    _send([*descendants(proc.pid), proc.pid], signal.SIGKILL)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _send(processes: Sequence[Found | int], sig: int) -> None:
    """Signals each process a scan found, if it is still that process; a bare pid is the agent's own child, not
    reaped yet, so its pid is still its own.

    Between the scan and the signal a listed process may exit and, were the pids to wrap meanwhile, its pid go
    to another process: another team's attempt, the database, the agent. A pidfd pins the process holding the
    pid when it is opened (a signal through it never reaches a later one), and that process is signalled only if
    it started when the scanned one did. Where pidfds are refused (a kernel before 5.3, a seccomp profile), the
    start time is checked and the pid signalled: a window of a moment, not the scan's, and the job still ends."""
    for process in processes:
        if isinstance(process, int):
            with contextlib.suppress(ProcessLookupError):
                os.kill(process, sig)
            continue
        try:
            pinned = os.pidfd_open(process.pid)
        except ProcessLookupError:
            continue
        except OSError:
            _send_unpinned(process, sig)
            continue
        try:
            if start_ticks(process.pid) == process.start:
                signal.pidfd_send_signal(pinned, sig)
        except ProcessLookupError:  # gone meanwhile: nothing to signal
            pass
        except OSError as exc:  # its /proc entry went (gone too), or the send refused where the open was not
            if exc.errno in (errno.ENOSYS, errno.EPERM):
                _send_unpinned(process, sig)
        finally:
            os.close(pinned)


def _send_unpinned(process: Found, sig: int) -> None:
    with contextlib.suppress(OSError):  # gone meanwhile: nothing to signal
        if start_ticks(process.pid) == process.start:
            os.kill(process.pid, sig)
