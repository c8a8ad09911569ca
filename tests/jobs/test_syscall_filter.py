"""The system calls a job may not make, tried from inside real bubblewrap jobs (root and bwrap, as on CI).

Each probe calls the kernel directly through ctypes with harmless arguments and prints what came back:
'ok' (the call got through to the kernel, which may still have refused it for other reasons: see
'allowed') or the errno's name.
"""

import json
import os
import re
import shutil
import struct
import tempfile
from pathlib import Path

import pytest

from jobs import sandbox, syscalls
from tests.jobs.sandboxed import ROOT_AND_BWRAP, run_job

JOB_UID = 398801

# Calls the kernel with each (name, number, args) of argv[1] and prints {name: 'ok' | errno name}.
PROBE = r"""
import ctypes, errno, json, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
seen = {}
for name, number, args in json.loads(sys.argv[1]):
    args = [params if a == "params" else (a.encode() if isinstance(a, str) else ctypes.c_long(a)) for a in args]
    result = libc.syscall(ctypes.c_long(number), *args)
    seen[name] = "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]
print(json.dumps(seen))
"""
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
UFFD_USER_MODE_ONLY = 1
FAN_REPORT_FID = 0x200
AF_VSOCK, SOCK_STREAM = 40, 1
# Each call with arguments that succeed, or fail otherwise than the filter answers, without a filter (on this
# machine, as measured before the filter: io_uring_setup, add_key, keyctl, userfaultfd and fanotify_init ok,
# perf_event_open EFAULT, bpf and clone3 EINVAL, unshare ENOSPC from bubblewrap's --disable-userns).
CALLS = {
    "io_uring_setup": [1, "params"],
    "add_key": ["user", "e31-probe", "secret", 6, -3],  # into the job's own session keyring
    "keyctl": [0, -3, 0],  # KEYCTL_GET_KEYRING_ID of the session keyring
    "userfaultfd": [UFFD_USER_MODE_ONLY],
    "fanotify_init": [FAN_REPORT_FID, 0],
    "perf_event_open": [0, 0, -1, -1, 0],  # a NULL attribute: EFAULT when the call gets through
    "bpf": [0, 0, 0],  # BPF_MAP_CREATE with no attribute
    "unshare": [CLONE_NEWUSER | CLONE_NEWNET],  # any mask with CLONE_NEWUSER in it
    "clone3": [0, 0],  # no arguments: EINVAL when it gets through; ENOSYS makes glibc use clone
}
VSOCK = "import socket\ntry:\n    socket.socket(40, 1); print('opened')\nexcept OSError as exc:\n    print(exc.strerror)"


def _number(name: str) -> int:
    return syscalls.number(name)


def _probe(calls: dict[str, list]) -> dict[str, str]:
    wanted = [(name, _number(name), args) for name, args in calls.items()]
    out = run_job(JOB_UID, ["/usr/bin/python3", "-c", PROBE, json.dumps(wanted)])
    return json.loads(out.splitlines()[-1])


@ROOT_AND_BWRAP
def test_a_job_cannot_reach_io_uring_bpf_perf_userfaultfd_fanotify_keyrings_or_new_namespaces():
    seen = _probe(CALLS)
    assert seen == {
        "io_uring_setup": "ENOSYS", "add_key": "EPERM", "keyctl": "EPERM", "userfaultfd": "EPERM",
        "fanotify_init": "EPERM", "perf_event_open": "EPERM", "bpf": "EPERM", "unshare": "EPERM", "clone3": "ENOSYS",
    }  # fmt: skip


@ROOT_AND_BWRAP
def test_a_job_cannot_take_the_nodes_aio_contexts():
    """io_setup draws on fs.aio-max-nr, one count for the whole node (65536 here): a job that asked for all of it
    left every other job, and root, with EAGAIN. It answers 'not implemented', so libaio falls back to plain I/O;
    one context is asked for here, so that a failing run takes almost nothing from the node."""
    assert _probe({"io_setup": [1, "params"]}) == {"io_setup": "ENOSYS"}  # params: a zeroed aio_context_t


@ROOT_AND_BWRAP
def test_a_job_cannot_open_a_vsock_around_its_network_namespace():
    """This VM has virtio-vsock: a job opened one (a way to the hypervisor's services that no netns contains)."""
    assert run_job(JOB_UID, ["/usr/bin/python3", "-c", VSOCK]) == "Operation not permitted"


# socket and socketpair from inside a job, through the syscall itself (as a program could make it, with all 64
# bits of the family's register): argv[1] lists [call, number, family, type]; {"socket 5": 'ok' | errno name}.
FAMILIES_PROBE = r"""
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
pair = (ctypes.c_int * 2)(-1, -1)
seen = {}
for call, number, family, kind in json.loads(sys.argv[1]):
    made = libc.syscall(ctypes.c_long(number), ctypes.c_long(family), ctypes.c_long(kind), ctypes.c_long(0), pair)
    seen[f"{call} {family}"] = "ok" if made >= 0 else errno.errorcode[ctypes.get_errno()]
print(json.dumps(seen))
"""
SOCK_DGRAM, SOCK_RAW = 2, 3
HIGH_VSOCK = AF_VSOCK | 1 << 32  # the kernel reads an int: AF_VSOCK, which an equality on 64 bits let through


@ROOT_AND_BWRAP
def test_a_job_opens_sockets_of_the_unix_inet_and_netlink_families_only():
    """Any other family answers EAFNOSUPPORT before the kernel sees it, so a distribution kernel loads no module
    for it (AF_RDS, AF_TIPC, AF_CAN...: rarely used code, behind privilege escalations). This kernel has few of
    those modules, so it answers EAFNOSUPPORT itself to most of them: AF_PACKET (17) and AF_XDP (44) are here,
    and without the filter they answered EPERM (no CAP_NET_RAW), which tells the filter's answer apart.
    AF_ALG and AF_VSOCK keep their EPERM; AF_VSOCK with bits set above the int the kernel reads opened one."""
    refused = {"AF_UNSPEC": 0, "AF_APPLETALK": 5, "AF_X25": 9, "AF_PACKET": 17, "AF_RDS": 21, "AF_CAN": 29,
               "AF_TIPC": 30, "AF_XDP": 44, "past AF_MAX": 200, "AF_VSOCK with high bits": HIGH_VSOCK}  # fmt: skip
    kinds = {17: SOCK_RAW, 44: SOCK_RAW, HIGH_VSOCK: SOCK_STREAM}
    calls = [("socket", family, kinds.get(family, SOCK_DGRAM)) for family in refused.values()]
    calls += [("socket", 1, SOCK_DGRAM), ("socket", 2, SOCK_DGRAM), ("socket", 10, SOCK_DGRAM),
              ("socket", 16, SOCK_DGRAM), ("socketpair", 1, SOCK_DGRAM), ("socketpair", 30, SOCK_DGRAM),
              ("socket", 38, SOCK_DGRAM + 3), ("socket", 40, SOCK_DGRAM - 1)]  # fmt: skip
    calls = [(call, _number(call), family, kind) for call, family, kind in calls]
    out = run_job(JOB_UID, ["/usr/bin/python3", "-c", FAMILIES_PROBE, json.dumps(calls)])
    seen = json.loads(out.splitlines()[-1])
    assert {name: seen[f"socket {family}"] for name, family in refused.items()} == dict.fromkeys(
        refused, "EAFNOSUPPORT"
    )
    assert [seen[f"socket {family}"] for family in (1, 2, 10, 16)] == ["ok"] * 4  # unix, inet, inet6, netlink
    assert (seen["socketpair 1"], seen["socketpair 30"]) == ("ok", "EAFNOSUPPORT")
    assert (seen["socket 38"], seen["socket 40"]) == ("EPERM", "EPERM")  # AF_ALG (SOCK_SEQPACKET), AF_VSOCK


@ROOT_AND_BWRAP
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the x32 ABI is x86_64's")
def test_a_call_through_another_abi_kills_the_job_instead_of_passing_the_filter():
    """keyctl as an x32 call (its number with bit 30 set) would match no rule of the x86_64 filter: the whole job
    is killed, not only the thread that made the call."""
    script = (
        "import ctypes, threading; libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('before', flush=True)\n"
        "x32 = lambda: libc.syscall(ctypes.c_long(0x40000000 | 250), ctypes.c_long(0), ctypes.c_long(-3), 0)\n"
        "thread = threading.Thread(target=x32, daemon=True); thread.start(); thread.join(5)\n"
        "print('after', flush=True)"
    )
    assert run_job(JOB_UID, ["/usr/bin/python3", "-c", script]) == "before"


@ROOT_AND_BWRAP
def test_the_filter_leaves_what_jobs_do_every_day():
    """Threads (clone, after clone3's ENOSYS), processes, pipes, sockets, memory maps and CPU affinity all work."""
    script = (
        "import json, mmap, os, socket, subprocess, threading\n"
        "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
        "child = subprocess.run(['/bin/sh', '-c', 'echo child'], capture_output=True, text=True).stdout.strip()\n"
        "a, b = socket.socketpair(); a.sendall(b'x'); got = b.recv(1).decode()\n"
        "tcp = socket.socket(socket.AF_INET6, socket.SOCK_STREAM); tcp.close()\n"
        "m = mmap.mmap(-1, 4096); m[:2] = b'ok'\n"
        "os.sched_setaffinity(0, os.sched_getaffinity(0))\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "names = os.listdir('/proc/self/fd')  # its own descriptor for the listing is gone by now\n"
        "fds = sorted(os.readlink(f'/proc/self/fd/{fd}') for fd in names if os.path.lexists(f'/proc/self/fd/{fd}'))\n"
        "print(json.dumps([child, got, m[:2].decode(), status['Seccomp'].strip(), fds]))"
    )
    child, got, mapped, seccomp, fds = json.loads(
        run_job(JOB_UID, ["/usr/bin/python3", "-c", script]).splitlines()[-1]
    )
    assert [child, got, mapped, seccomp] == ["child", "x", "ok", "2"]  # 2: a seccomp filter is on
    assert not [
        fd for fd in fds if "memfd:" in fd
    ]  # neither the filter's descriptor nor a secret's reached it


@ROOT_AND_BWRAP
def test_a_node_whose_filter_cannot_be_built_runs_no_jobs(monkeypatch, tmp_path):
    """libseccomp missing, too old or refusing: the probe says why, and no job starts without the filter."""

    def broken() -> bytes:
        raise syscalls.FilterUnavailable("libseccomp is not usable here (Unable to find libseccomp)")

    monkeypatch.setattr(syscalls, "compiled", broken)
    assert "Unable to find libseccomp" in sandbox.refusal(probe_uid=JOB_UID)
    with pytest.raises(syscalls.FilterUnavailable):
        sandbox.launch(["bwrap", "--", "/usr/bin/true"], env={}, cwd=tmp_path, mode=sandbox.BUBBLEWRAP,
                       confinement=sandbox.Confinement(uid=JOB_UID, gid=JOB_UID))  # fmt: skip


@ROOT_AND_BWRAP
def test_the_start_up_probe_runs_under_the_filter(monkeypatch):
    """A filter that kills every call (one BPF instruction: return SECCOMP_RET_KILL_PROCESS) fails the probe."""
    monkeypatch.setattr(syscalls, "compiled", lambda: struct.pack("HBBI", 0x06, 0, 0, 0x80000000))
    assert "bubblewrap cannot run a job here" in sandbox.refusal(probe_uid=JOB_UID)


def test_every_denied_call_is_in_the_compiled_filter_with_its_answer():
    """Read back from libseccomp's own rendering of the program (PFC): each name this architecture has, with the
    errno it gets; a misspelt or silently dropped name would be missing here."""
    with tempfile.TemporaryFile("w+") as pfc:
        syscalls.rules().export_pfc(pfc)
        pfc.seek(0)
        rendered = pfc.read()
    answers = dict(re.findall(r'filter for syscall "(\w+)".*\n(?:.*\n)*?\s*action (\w+\(\d+\))', rendered))
    here = [n for names in syscalls.DENIED.values() for n in names if syscalls.number(n) >= 0]
    assert len(here) >= 30 and {n: answers.get(n) for n in here} == dict.fromkeys(here, "ERRNO(1)")  # EPERM
    assert {n: answers.get(n) for n in syscalls.ABSENT} == dict.fromkeys(
        syscalls.ABSENT, "ERRNO(38)"
    )  # ENOSYS
    assert {"socket", "socketpair", "unshare", "clone"} <= set(answers)  # by their arguments


@pytest.mark.django_db
def test_an_agent_that_cannot_sandbox_refuses_to_start_and_says_why(settings, monkeypatch):
    from django.core.management import CommandError, call_command

    state = Path(tempfile.mkdtemp(prefix="e31-agent-"))
    state.chmod(0o711)  # job uids pass through to their directories, as a node's state directory allows
    try:
        for name in ("E31_AGENT_ROOT", "E31_STAGING_ROOT", "E31_CHECKPOINT_ROOT", "E31_UID_REGISTRY"):
            setattr(settings, name, state / name.lower())
        monkeypatch.setattr(
            sandbox, "refusal", lambda **_: "the job syscall filter cannot be built: no libseccomp"
        )
        with pytest.raises(
            CommandError, match="cannot be sandboxed here: the job syscall filter cannot be built"
        ):
            call_command(
                "node_agent", "--name", "n-filterless", "--virtual-gpus", "1", "--uid-base", "611000"
            )
    finally:
        shutil.rmtree(state)


@pytest.mark.django_db
def test_the_submit_form_says_where_a_job_runs_and_which_calls_it_is_refused(member_client):
    from django.urls import reverse

    page = member_client.get(reverse("jobs:new")).content.decode()
    section = page[page.index('id="where-jobs-run"') :]
    for names in syscalls.DENIED.values():
        assert ", ".join(names) in section
    assert "AF_ALG and AF_VSOCK" in section and "<code>io_uring</code>" in section
    assert "<code>io_setup</code> answer <em>not implemented</em>" in section
    assert (
        "other than Unix, IPv4, IPv6 and netlink ones answer <em>Address family not supported</em>" in section
    )
    assert f"at most {sandbox.JOB_OPEN_FILES} open files" in section and "no terminal" in section


UEVENT_PROBE = r"""
import ctypes, errno, socket, sys
for protocol in (15, 0):  # NETLINK_KOBJECT_UEVENT, NETLINK_ROUTE
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, protocol).close(); print(protocol, "opened")
    except OSError as exc:
        print(protocol, exc.strerror)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
made = libc.syscall(ctypes.c_long(int(sys.argv[1])), ctypes.c_long(16), ctypes.c_long(3), ctypes.c_long(15 | 1 << 32))
print("high bits", "opened" if made >= 0 else errno.errorcode[ctypes.get_errno()])
"""


@ROOT_AND_BWRAP
def test_a_job_cannot_listen_to_the_nodes_device_events():
    """In a network namespace of the node's (a job spanning nodes, or with internet access), a netlink socket of
    the kernel's device events heard another attempt's space mounted (``change@/devices/virtual/block/loop1``):
    when other tenants' attempts start and end. Refused; netlink's routing sockets stay open to jobs."""
    out = run_job(JOB_UID, ["/usr/bin/python3", "-c", UEVENT_PROBE, str(_number("socket"))])
    # the kernel reads the protocol as an int: 15 with a bit set above it is the same socket
    assert out.splitlines()[-3:] == ["15 Operation not permitted", "0 opened", "high bits EPERM"]
