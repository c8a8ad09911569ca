"""The system calls a job may not make: a seccomp filter bubblewrap installs just before the job's first instruction.

The sandbox already takes away what these calls would need (capabilities, a namespace of the job's own),
so most of them fail anyway; the filter closes the rest, where the kernel itself is the attack surface.
It is a deny list in the manner of Docker's and Flatpak's default profiles, kept short enough to read:
everything else a job does (threads, processes, sockets, GPU ioctls, NUMA placement, ptrace of its own
processes) is allowed. libseccomp compiles it (through pyseccomp's ctypes binding, which mirrors
libseccomp's own Python API); a call made through another ABI than the node's own (32-bit ``int 0x80``
or x32 on x86_64) kills the whole process, so none of these can be reached that way.
"""

import errno
import functools
import os

DENIED = {
    # Keyrings are not namespaced: keys and their quota are shared with every job on the node.
    "kernel keyrings": ("add_key", "keyctl", "request_key"),
    # Reachable without privilege and behind a long run of kernel privilege escalations; no GPU job needs them.
    "kernel extension points": ("bpf", "perf_event_open", "userfaultfd"),
    # Another process's file accesses, on the /usr (or image) every job shares; Docker allows it only with
    # CAP_SYS_ADMIN. (inotify, which many programs use, shows a watched file's opens too: left allowed.)
    "watching other processes' file accesses": ("fanotify_init",),
    # A job has its namespaces and mounts already and no capability to change them: defence in depth.
    "namespaces and mounts": (
        "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig",
        "fsmount", "fspick", "mount_setattr",
    ),
    # The node's kernel, clock and hardware, none of them a job's (most need a capability it has not got).
    "the node's kernel, clock and hardware": (
        "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon",
        "swapoff", "acct", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "syslog", "quotactl",
        "quotactl_fd", "iopl", "ioperm", "open_by_handle_at", "lookup_dcookie", "vhangup", "uselib", "nfsservctl",
    ),
}  # fmt: skip
# Answered as if this kernel lacked them, so that programs fall back: io_uring to epoll and threads, clone3
# (whose flags sit in memory a filter cannot read) to clone, whose flags it can, and libaio's io_setup to plain
# reads and writes. io_setup draws on fs.aio-max-nr, one count for the whole node: a job took all 65536 of it,
# and every other job's io_setup, root's too, got EAGAIN. (The rest of the AIO calls need the context it makes.)
ABSENT = ("io_uring_setup", "io_uring_enter", "io_uring_register", "clone3", "io_setup")
# The socket families a job may open (socket's and socketpair's first argument; the multiplexed socketcall of
# 32-bit ABIs is out of reach, other ABIs being killed). Any other answers EAFNOSUPPORT before the kernel sees
# it, as if it were not built: on a distribution kernel, asking for AF_RDS, AF_TIPC, AF_CAN and the like loads
# their rarely used modules, behind a long run of privilege escalations, for every tenant on the node.
SOCKET_ALLOWED = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}
# Of the rest, these two answer EPERM, refused as moby's profile does: AF_ALG, the kernel's crypto API (page-cache
# writes into the shared /usr through its bugs), and AF_VSOCK, which reaches the hypervisor's (and the node's)
# services around the job's namespace and egress rules.
SOCKET_FAMILIES = {"AF_ALG": 38, "AF_VSOCK": 40}
# Families below this are answered one by one; this and all above (AF_MAX is 46 on 6.x kernels, and a value with
# bits set above the int the kernel reads) by one comparison: libseccomp takes one comparison per argument a rule.
SOCKET_FAMILIES_LISTED = max(SOCKET_FAMILIES.values()) + 1
# Of netlink, the kernel's device events (NETLINK_KOBJECT_UEVENT) answer EPERM: in a network namespace of the
# node's (a job spanning nodes, or with internet access) a job heard other attempts' spaces mounted and removed,
# when other tenants' jobs start and end. Its routing and other sockets stay open (ip, NCCL read them).
AF_NETLINK, NETLINK_KOBJECT_UEVENT = 16, 15
INT_BITS = 0xFFFFFFFF  # the kernel reads the protocol as an int: bits above it must not slip past the rule
# A user namespace would give the job every capability inside it (bubblewrap's --disable-userns closes this
# where it has the flag, 0.8 and later; the filter closes it on older ones too).
CLONE_NEWUSER = 0x10000000
UNKNOWN = -1  # libseccomp's __NR_SCMP_ERROR: a name it does not know


class FilterUnavailable(RuntimeError):
    """libseccomp is missing here or refused the filter: no job may start without it."""


def number(name: str) -> int:
    """The call's number on this machine's own architecture, as libseccomp knows it (a negative one of
    libseccomp's own for a call this architecture lacks, which a rule then ignores)."""
    seccomp = _binding()
    found = seccomp.resolve_syscall(seccomp.system_arch(), name)
    if found == UNKNOWN:
        raise FilterUnavailable(f"this libseccomp does not know {name}: install a newer libseccomp2")
    return found


@functools.cache
def compiled() -> bytes:
    """The filter as the BPF program bubblewrap's ``--seccomp`` loads, built once per process."""
    try:
        return export(rules())
    except OSError as exc:  # libseccomp refused a rule or the export
        raise FilterUnavailable(f"libseccomp could not build the job syscall filter: {exc}") from exc


def export(program) -> bytes:
    """A ``pyseccomp.SyscallFilter`` as BPF bytes (libseccomp writes only to a descriptor: an in-memory one)."""
    with open(os.memfd_create("e31-syscall-filter", os.MFD_CLOEXEC), "w+b") as bpf:
        program.export_bpf(bpf)
        bpf.seek(0)
        return bpf.read()


def rules():
    """The filter as libseccomp holds it (a ``pyseccomp.SyscallFilter``; its ``export_pfc`` shows it readably)."""
    seccomp = _binding()
    refuse, absent = seccomp.ERRNO(errno.EPERM), seccomp.ERRNO(errno.ENOSYS)
    program = seccomp.SyscallFilter(seccomp.ALLOW)
    program.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)  # the whole job, not just the thread
    for names in DENIED.values():
        for name in names:
            program.add_rule(refuse, number(name))
    for name in ABSENT:
        program.add_rule(absent, number(name))
    _socket_rules(program, refuse=refuse, unsupported=seccomp.ERRNO(errno.EAFNOSUPPORT))
    # clone's flags come first, except on s390x, whose clone takes the new stack first.
    clone_flags = 1 if os.uname().machine == "s390x" else 0
    for name, flags in (("unshare", 0), ("clone", clone_flags)):
        program.add_rule(refuse, name, seccomp.Arg(flags, seccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    return program


def _socket_rules(program, *, refuse, unsupported) -> None:
    seccomp = _binding()
    refused = set(SOCKET_FAMILIES.values())
    for name in ("socket", "socketpair"):
        for family in set(range(SOCKET_FAMILIES_LISTED)) - set(SOCKET_ALLOWED.values()):
            answer = refuse if family in refused else unsupported
            program.add_rule(answer, name, seccomp.Arg(0, seccomp.EQ, family))
        program.add_rule(unsupported, name, seccomp.Arg(0, seccomp.GE, SOCKET_FAMILIES_LISTED))
        program.add_rule(
            refuse, name, seccomp.Arg(0, seccomp.EQ, AF_NETLINK),
            seccomp.Arg(2, seccomp.MASKED_EQ, INT_BITS, NETLINK_KOBJECT_UEVENT),
        )  # fmt: skip


def filter_fd() -> int:
    """An anonymous in-memory file holding the compiled filter, at its start, for bubblewrap to read.

    Inheritable only where the caller passes it (``pass_fds``); the caller closes it once bubblewrap started.
    """
    program = compiled()
    fd = os.memfd_create("e31-syscall-filter", os.MFD_CLOEXEC)
    try:
        with open(fd, "wb", closefd=False) as handle:
            handle.write(program)
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd


def _binding():
    try:
        import pyseccomp  # loads the system's libseccomp when imported, so only where a filter is wanted
    except (ImportError, RuntimeError, OSError) as exc:
        raise FilterUnavailable(f"libseccomp is not usable here ({exc}): install libseccomp2") from exc
    return pyseccomp
