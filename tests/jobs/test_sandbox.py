"""The sandbox launcher on its own (no database): uids, the view's command line, GPUs and their cgroup.

The GPU tests use fake device nodes under a device root made here, as a node without GPUs must:
each fake GPU is a copy (mknod) of a harmless character device that opens for anyone, with a
major:minor of its own, so the devices cgroup can tell them apart from each other and from the
standard devices (/dev/null's 1:3 stands in for the control devices, which are always allowed).
"""

import concurrent.futures
import ctypes
import json
import multiprocessing
import os
import resource
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from jobs import devices, network, sandbox
from tests import machine
from tests.jobs.sandboxed import ROOT_AND_BWRAP, run_job

ROOT_BWRAP_AND_DEVICES_CGROUP = machine.needs(root=True, bwrap=True, devices_cgroup=True)
FAKE_GPUS = {"nvidia0": (10, 229), "nvidia1": (10, 200), "nvidiactl": (1, 3), "nvidia-uvm": (1, 5)}
JOB_UID = 398765


def test_each_attempt_gets_a_uid_of_its_own_until_it_gives_it_back():
    uids = sandbox.UidRange(500000, 3)
    first, second, third = uids.take(7), uids.take(7), uids.take(7)
    assert {first, second, third} == {500000, 500001, 500002} and first == 500000 + 7 % 3
    with pytest.raises(RuntimeError, match="all 3 job uids from 500000 are in use"):
        uids.take(1)
    uids.give_back(second)
    assert uids.take(1) == second
    with pytest.raises(ValueError):
        sandbox.UidRange(0, 10)  # never root's, nor a system account's


def attempt(tmp: Path) -> sandbox.AttemptDirs:
    root = tmp / "attempt"
    dirs = sandbox.AttemptDirs(root=root, work=root / "work", output=root / "output", data=tmp / "data")
    dirs.create(owner=JOB_UID if os.geteuid() == 0 else os.getuid())
    sandbox.write_identity(dirs, uid=JOB_UID, gid=JOB_UID)
    return dirs


def test_the_command_binds_the_allow_list_never_the_host_root(tmp_path):
    dirs = attempt(tmp_path)
    plain = sandbox.command(argv=["true"], env={}, dirs=dirs, workdir="", mode=sandbox.BUBBLEWRAP,
                            confinement=sandbox.Confinement(uid=JOB_UID, gid=JOB_UID))  # fmt: skip
    pairs = list(zip(plain, plain[1:], plain[2:], strict=False))
    assert ("--ro-bind", "/", "/") not in pairs and "--share-net" not in plain and "--unshare-net" in plain
    assert ("--ro-bind", "/usr", "/usr") in pairs
    assert ("--ro-bind", str(dirs.root / "passwd"), "/etc/passwd") in pairs
    assert ("--bind", str(dirs.root), str(dirs.root)) not in pairs  # job.log stays the agent's
    assert plain[plain.index("--remount-ro") + 1] == "/"  # no file of its own under / or /etc
    wired = sandbox.command(argv=["true"], env={}, dirs=dirs, workdir="", mode=sandbox.BUBBLEWRAP,
                            confinement=sandbox.Confinement(uid=JOB_UID, gid=JOB_UID, netns="e31-x"))  # fmt: skip
    assert "--unshare-net" not in wired  # the process joined the agent's namespace before bubblewrap


def test_platform_paths_inside_the_view_are_found(tmp_path):
    assert sandbox.exposed_by_view([Path("/usr/local/e31/var"), Path("/etc/ssl/certs/x")]) == [
        Path("/usr/local/e31/var"),
        Path("/etc/ssl/certs/x"),
    ]
    assert sandbox.exposed_by_view([tmp_path, Path("/etc/e31/secret-key"), Path("/var/lib/e31")]) == []


def test_the_synthesized_passwd_names_the_job_and_no_host_account():
    passwd, group = sandbox.passwd_lines(uid=JOB_UID, gid=JOB_UID, home=Path("/w"))
    assert f"job:x:{JOB_UID}:{JOB_UID}:e31 job:/w:/bin/sh" in passwd.splitlines()
    assert [line.split(":")[0] for line in passwd.splitlines()] == ["root", "job", "nobody"]
    assert f"job:x:{JOB_UID}:" in group


def test_every_part_of_a_node_gets_its_own_addresses_from_the_nodes_slice():
    subnet = "100.64.0.0/10"
    assert str(network.node_slice(subnet, 3)) == "100.64.3.0/24"
    assert network.part_addresses(subnet, 3, [0, 1]) == ("100.64.3.1", "100.64.3.2")
    assert network.part_addresses(subnet, 3, [4]) == ("100.64.3.17", "100.64.3.18")
    assert network.part_addresses(subnet, 300, [0])[1] == "100.65.44.2"
    with pytest.raises(network.NetworkError):
        network.part_addresses(subnet, 3, [64])
    net = network.plan(subnet=subnet, key="abcdefghij", slot=3, gpu_indices=[4], peers=[(3, [4]), (5, [0])])
    assert net.peers == ("100.64.3.18", "100.64.5.2") and net.address == "100.64.3.18"
    assert len(net.host_link) <= 15  # the kernel's limit on a link's name


def test_a_slot_past_the_subnets_slices_gets_no_wrapped_slice_of_another_node():
    """/10 has 16384 /24s: slot 16385 would wrap onto slot 1's addresses; a /24 has one slice, slot 0's."""
    assert network.slice_refusal("100.64.0.0/10", 16383) == ""
    for subnet, slot in (("100.64.0.0/10", 16385), ("100.64.0.0/24", 1), ("100.64.0.0/24", None)):
        assert "/24" in network.slice_refusal(subnet, slot)
        with pytest.raises(network.NetworkError):
            network.part_addresses(subnet, slot, [0])


def test_cuda_visible_devices_uses_uuids_when_the_node_knows_them():
    uuids = {0: "GPU-a", 1: "GPU-b", 3: "GPU-d"}  # GPU 2 fell off the bus: the others keep their minors
    assert devices.visible_devices([1, 3], uuids) == "GPU-b,GPU-d"
    assert devices.visible_devices([1, 3], {}) == "1,3"  # virtual GPUs


@pytest.fixture
def fake_device_root():
    """Fake GPUs and control devices; a folder job uids can pass through (bubblewrap binds as them)."""
    root = Path(tempfile.mkdtemp(prefix="e31-fake-dev-"))
    root.chmod(0o755)
    for name, (major, minor) in FAKE_GPUS.items():
        os.mknod(root / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        (root / name).chmod(0o666)
    yield root
    shutil.rmtree(root)


def test_only_the_allocated_gpu_and_the_control_devices_are_bound(fake_device_root):
    assert devices.gpu_nodes(fake_device_root, [1]) == (
        fake_device_root / "nvidia1", fake_device_root / "nvidiactl", fake_device_root / "nvidia-uvm"
    )  # fmt: skip


OPEN_EACH = """
import json, os, sys
out = {}
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR)); out[path] = 'opened'
    except OSError as exc:
        out[path] = os.strerror(exc.errno)
print(json.dumps({'uid': os.getuid(), 'dev': sorted(os.listdir('/dev')), 'opened': out}))
"""


@ROOT_BWRAP_AND_DEVICES_CGROUP
def test_the_devices_cgroup_refuses_a_gpu_not_allocated_even_when_the_job_can_see_its_node(fake_device_root):
    """Both fake GPUs are bound in, as if a node had leaked in; the group allows nvidia0 alone: EPERM."""
    state = Path(tempfile.mkdtemp(prefix="e31-sandbox-"))
    state.chmod(0o711)
    try:
        dirs = attempt(state)
        allocated = devices.gpu_nodes(fake_device_root, [0])
        leaked = (*allocated, fake_device_root / "nvidia1")
        procs = devices.constrain(f"t{os.getpid()}", allocated)
        confinement = sandbox.Confinement(
            uid=JOB_UID, gid=JOB_UID, devices=leaked, cgroup_procs=(str(procs),)
        )
        argv = [
            "/usr/bin/python3",
            "-c",
            OPEN_EACH,
            "/dev/nvidia0",
            "/dev/nvidia1",
            "/dev/nvidiactl",
            "/dev/null",
        ]
        seen = _last_json_line(argv, dirs, confinement)
    finally:
        devices.release(f"t{os.getpid()}")
        shutil.rmtree(state)
    assert seen["uid"] == JOB_UID
    assert seen["opened"] == {
        "/dev/nvidia0": "opened",
        "/dev/nvidia1": "Operation not permitted",  # EPERM: the devices cgroup, not file permissions
        "/dev/nvidiactl": "opened",
        "/dev/null": "opened",
    }


@ROOT_AND_BWRAP
def test_a_job_sees_exactly_its_gpus_and_cannot_make_another(fake_device_root):
    state = Path(tempfile.mkdtemp(prefix="e31-sandbox-"))
    state.chmod(0o711)
    probe = (
        OPEN_EACH
        + "\ntry:\n    os.mknod('/tmp/gpu1', 0o666 | 0o020000, os.makedev(10, 200)); print('made')\nexcept OSError as exc:\n    print(os.strerror(exc.errno))\n"
    )
    try:
        dirs = attempt(state)
        allocated = devices.gpu_nodes(fake_device_root, [1])
        procs = devices.constrain(f"u{os.getpid()}", allocated)  # None without the v1 devices hierarchy
        confinement = sandbox.Confinement(
            uid=JOB_UID, gid=JOB_UID, devices=allocated, cgroup_procs=(str(procs),) if procs else ()
        )
        argv = ["/usr/bin/python3", "-c", probe, "/dev/nvidia0", "/dev/nvidia1"]
        cmd = sandbox.command(argv=argv, env={"PATH": "/usr/bin"}, dirs=dirs, workdir="", mode=sandbox.BUBBLEWRAP,
                              confinement=confinement)  # fmt: skip
        proc = sandbox.launch(cmd, env={}, cwd=dirs.work, mode=sandbox.BUBBLEWRAP, confinement=confinement)
        out, _ = proc.communicate(timeout=60)
        lines = out.decode().strip().splitlines()
    finally:
        devices.release(f"u{os.getpid()}")
        shutil.rmtree(state)
    seen = json.loads(lines[-2])
    assert [d for d in seen["dev"] if d.startswith("nvidia")] == ["nvidia-uvm", "nvidia1", "nvidiactl"]
    assert seen["opened"] == {"/dev/nvidia0": "No such file or directory", "/dev/nvidia1": "opened"}
    assert lines[-1] == "Operation not permitted"  # no capability to make device nodes


def test_the_node_can_isolate_parts_of_spanning_jobs_here():
    """This machine provides what a node needs (root, network namespaces, veth, nftables)."""
    if os.geteuid() != 0:
        assert "not root" in network.refusal()
    else:
        assert network.refusal() == "", network.refusal()


# keyctl(2) and add_key(2) from inside a job, through ctypes (no keyutils on a bare node).
KEYS_PROBE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ADD_KEY, KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[os.uname().machine]
SESSION = ctypes.c_long(-3)
if sys.argv[1] == "leave":
    r = libc.syscall(ADD_KEY, b"user", b"e31-drop", b"team-a-token", ctypes.c_size_t(12), SESSION)
    print("left" if r > 0 else os.strerror(ctypes.get_errno()))
else:
    key = libc.syscall(KEYCTL, ctypes.c_long(10), SESSION, b"user", b"e31-drop", ctypes.c_long(0))
    buf = ctypes.create_string_buffer(64)
    print(buf.raw[: libc.syscall(KEYCTL, ctypes.c_long(11), ctypes.c_long(key), buf, ctypes.c_long(64))]
          if key > 0 else os.strerror(ctypes.get_errno()))
"""


def _two_jobs_under_an_agent_with_a_session_keyring() -> tuple[str, str]:
    """In a child process, as an agent that systemd (KeyringMode=private) or a PAM login started: with a
    session keyring of its own, which the jobs it starts would inherit."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(sandbox.SYS_KEYCTL[os.uname().machine], ctypes.c_long(1), b"e31-agent") > 0
    probe = ["/usr/bin/python3", "-c", KEYS_PROBE]
    return run_job(JOB_UID, [*probe, "leave"]), run_job(JOB_UID + 1, [*probe, "read"])


@ROOT_AND_BWRAP
@pytest.mark.usefixtures("filter_lets_everything_through")
def test_a_job_cannot_read_keys_another_teams_job_left_in_the_agents_session_keyring():
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as child:
        left, read = child.submit(_two_jobs_under_an_agent_with_a_session_keyring).result(timeout=120)
    assert left == "left"  # keys work inside a job, in its own keyring, where the filter lets them
    assert "team-a-token" not in read and read == "Required key not available"


@ROOT_AND_BWRAP
def test_with_the_syscall_filter_a_job_cannot_touch_a_keyring_at_all():
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as child:
        left, read = child.submit(_two_jobs_under_an_agent_with_a_session_keyring).result(timeout=120)
    assert left == read == "Operation not permitted"


@ROOT_AND_BWRAP
@pytest.mark.usefixtures("filter_lets_everything_through")  # bubblewrap's --disable-userns on its own
def test_a_job_cannot_make_namespaces_of_its_own_and_so_gets_no_capabilities_in_one():
    probe = (
        "import ctypes; libc = ctypes.CDLL(None, use_errno=True)\n"
        "r = libc.unshare(0x10000000)\n"  # CLONE_NEWUSER
        "print('unshared' if r == 0 else 'refused')"
    )
    assert run_job(JOB_UID, ["/usr/bin/python3", "-c", probe]) == "refused"
    assert run_job(JOB_UID, ["/usr/bin/python3", "-c", "print('runs')"]) == "runs"


@ROOT_AND_BWRAP
def test_a_bubblewrap_without_disable_userns_still_sandboxes_and_one_with_it_uses_it(tmp_path, monkeypatch):
    """bubblewrap 0.8 added --disable-userns: an older one (Ubuntu 22.04's 0.6) keeps sandboxing jobs without it,
    never falling back to running them unsandboxed."""
    dirs = attempt(tmp_path)
    confinement = sandbox.Confinement(uid=JOB_UID, gid=JOB_UID)

    def flags() -> list[str]:
        return sandbox.command(argv=["true"], env={}, dirs=dirs, workdir="", mode=sandbox.BUBBLEWRAP,
                               confinement=confinement)[:3]  # fmt: skip

    assert sandbox.disables_userns() and flags() == ["bwrap", "--unshare-user", "--disable-userns"]
    monkeypatch.setattr(sandbox, "disables_userns", lambda: False)
    assert flags() == ["bwrap", "--unshare-user", "--unshare-pid"]
    assert sandbox.refusal(probe_uid=JOB_UID) == ""


@ROOT_AND_BWRAP
def test_a_launcher_that_cannot_give_a_job_its_keyring_is_no_usable_sandbox(monkeypatch):
    """On an architecture whose keyctl number is unknown the probe says so (a refusal), instead of a traceback at start."""
    monkeypatch.setattr(sandbox, "SYS_KEYCTL", {})
    # subprocess reports an exception in preexec_fn with its own sentence, not the exception's
    assert sandbox.refusal(probe_uid=JOB_UID) == (
        f"the launcher cannot start a job here as uid {JOB_UID}: Exception occurred in preexec_fn."
    )


# Opens /dev/null until the kernel refuses: the limit a job runs under, the refusal, the last descriptor it got.
OPEN_UNTIL_REFUSED = """
import errno, json, os, resource
limits, last = resource.getrlimit(resource.RLIMIT_NOFILE), -1
try:
    while True:
        last = os.open('/dev/null', os.O_RDONLY)
except OSError as exc:
    refused = errno.errorcode[exc.errno]
print(json.dumps([list(limits), refused, last]))
"""


@ROOT_AND_BWRAP
def test_a_jobs_processes_each_hold_a_bounded_number_of_open_files(monkeypatch):
    """A job inherited the agent's open-files limit (20000 here): 20 of its processes held 401,187 files of the
    node's fs.file-max, and every process on the node that was not root got ENFILE. Each now stops at
    JOB_OPEN_FILES, or at the agent's own hard limit where that is lower (this root lacks CAP_SYS_RESOURCE to
    raise its 20000): a lower JOB_OPEN_FILES shows the job gets it, soft and hard."""
    job = ["/usr/bin/python3", "-c", OPEN_UNTIL_REFUSED]
    monkeypatch.setattr(sandbox, "JOB_OPEN_FILES", 4096)  # read in the launcher's fork: the job gets it
    assert json.loads(run_job(JOB_UID, job)) == [[4096, 4096], "EMFILE", 4095]
    monkeypatch.undo()
    agents = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    expected = (
        sandbox.JOB_OPEN_FILES if agents == resource.RLIM_INFINITY else min(sandbox.JOB_OPEN_FILES, agents)
    )
    assert json.loads(run_job(JOB_UID, job)) == [[expected, expected], "EMFILE", expected - 1]


def test_the_agent_raises_the_nodes_file_count_past_what_its_jobs_may_hold(settings, tmp_path):
    """A node kept the kernel's default fs.file-max (2,466,255 here): each job process may hold 65,536 files and a
    job E31_ATTEMPT_PIDS processes, so one job could take every file of the node and other teams' processes got
    ENFILE. The agent raises it at start past its attempts' product; a file then costs the job's own memory."""
    settings.E31_ATTEMPT_PIDS = 64
    file_max = tmp_path / "file-max"
    file_max.write_text("2466255\n")
    needed = sandbox.job_open_files() * 64 * 8
    assert sandbox.raise_file_max(attempts=8, path=file_max) == (
        f"raised fs.file-max from 2,466,255 to {needed:,}, past what its 8 attempts may hold"
    )
    assert int(file_max.read_text()) == needed
    assert sandbox.raise_file_max(attempts=8, path=file_max) == ""  # high enough: left as it is
    file_max.write_text(str(2**63 - 1))  # systemd's
    assert sandbox.raise_file_max(attempts=8, path=file_max) == "" and file_max.read_text() == str(2**63 - 1)


def test_an_agent_that_cannot_raise_the_nodes_file_count_says_so_and_how(settings):
    settings.E31_ATTEMPT_PIDS = 64
    # A count of the kernel's (65,536) that nobody may write, root neither.
    read_only = Path("/proc/sys/kernel/ngroups_max")
    needed = sandbox.job_open_files() * 64
    said = sandbox.raise_file_max(attempts=1, path=read_only)
    assert said.startswith(f"fs.file-max is 65,536, below the {needed:,} files its 1 attempts may hold"), said
    assert f"sysctl -w fs.file-max={needed}" in said


@machine.needs(root=True)
def test_the_agent_raises_the_real_fs_file_max():
    before = int(sandbox.FILE_MAX.read_text())
    attempts = before // (sandbox.job_open_files() * 4096) + 1  # just past today's value, whatever it is
    try:
        said = sandbox.raise_file_max(attempts=attempts)
        assert int(sandbox.FILE_MAX.read_text()) == sandbox.job_open_files() * 4096 * attempts > before, said
    finally:
        sandbox.FILE_MAX.write_text(f"{before}\n")


@ROOT_AND_BWRAP
def test_a_job_has_no_pseudo_terminals_to_take_from_the_node():
    """Every sandbox's devpts draws on the node's one kernel.pty.max: a job opened 3,071 terminals and another
    job's openpty() then failed. A job has no terminal: its /dev/pts is empty and read-only, on any cgroup version."""
    probe = (
        "import os\ntry:\n    os.openpty(); print('opened')\nexcept OSError as exc:\n    print(os.strerror(exc.errno))\n"
        "print(os.listdir('/dev/pts'))"
    )
    assert run_job(JOB_UID, ["/usr/bin/python3", "-c", probe]).splitlines() == [
        "No such file or directory",
        "[]",
    ]


@ROOT_BWRAP_AND_DEVICES_CGROUP
def test_the_devices_cgroup_refuses_pseudo_terminals_even_through_a_node_the_job_can_see(fake_device_root):
    """Where the v1 devices hierarchy exists, a terminal multiplexer (5:2) or terminal (136:*) node that reached
    the job anyway opens to EPERM: the group no longer allows them."""
    for name, (major, minor) in {"leaked-ptmx": (5, 2), "leaked-pts0": (136, 0)}.items():
        os.mknod(fake_device_root / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        (fake_device_root / name).chmod(0o666)
    state = Path(tempfile.mkdtemp(prefix="e31-sandbox-"))
    state.chmod(0o711)
    try:
        dirs = attempt(state)
        leaked = (fake_device_root / "leaked-ptmx", fake_device_root / "leaked-pts0")
        procs = devices.constrain(f"p{os.getpid()}", ())
        confinement = sandbox.Confinement(
            uid=JOB_UID, gid=JOB_UID, devices=leaked, cgroup_procs=(str(procs),)
        )
        argv = ["/usr/bin/python3", "-c", OPEN_EACH, "/dev/leaked-ptmx", "/dev/leaked-pts0", "/dev/null"]
        seen = _last_json_line(argv, dirs, confinement)
    finally:
        devices.release(f"p{os.getpid()}")
        shutil.rmtree(state)
    assert seen["opened"] == {
        "/dev/leaked-ptmx": "Operation not permitted",
        "/dev/leaked-pts0": "Operation not permitted",
        "/dev/null": "opened",
    }


@ROOT_AND_BWRAP
def test_a_job_reads_nothing_of_the_agents_environment_in_bubblewraps(monkeypatch):
    """Bubblewrap is the job's process 1, running as the job's uid: its environment was the agent's PATH (a
    /root/.pyenv/... here). It gets a fixed PATH and nothing else; the job's own environment is what it was given."""
    monkeypatch.setenv("PATH", f"/e31-agent-only/bin:{os.environ['PATH']}")
    monkeypatch.setenv("E31_AGENT_ONLY", "agent-secret")
    probe = "import os; print(open('/proc/1/environ').read().split('\\0')); print(os.environ['PATH'])"
    seen_by_init, own_path = run_job(JOB_UID, ["/usr/bin/python3", "-c", probe]).splitlines()
    assert seen_by_init == str(["PATH=/usr/sbin:/usr/bin:/sbin:/bin", ""])
    assert own_path == "/usr/bin:/bin"  # what run_job gives the job


def _last_json_line(argv: list[str], dirs, confinement) -> dict:
    """What ``argv``, run in the sandbox with ``confinement``, printed as JSON on its last line."""
    cmd = sandbox.command(argv=argv, env={"PATH": "/usr/bin"}, dirs=dirs, workdir="", mode=sandbox.BUBBLEWRAP,
                          confinement=confinement)  # fmt: skip
    proc = sandbox.launch(cmd, env={}, cwd=dirs.work, mode=sandbox.BUBBLEWRAP, confinement=confinement)
    out, _ = proc.communicate(timeout=60)
    return json.loads(out.decode().strip().splitlines()[-1])


CORE_LIMIT = """
import json, resource
soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
try:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    raised = "raised"
except (OSError, ValueError):
    raised = "refused"
print(json.dumps([soft, hard, raised]))
"""


@ROOT_AND_BWRAP
def test_a_job_cannot_dump_core_even_where_the_node_pipes_core_dumps_to_a_program():
    """A limit of 0 stops a core file, but where kernel.core_pattern pipes dumps to a program (apport,
    systemd-coredump), the kernel ignores it and runs that program as root, outside the job's groups, once per
    crash, reading the job's memory and environment (its secrets). 1 is the kernel's own value that aborts a dump to
    a pipe, and, under the smallest core file, a dump to a file too; the job cannot raise its hard limit."""
    assert json.loads(run_job(JOB_UID, ["/usr/bin/python3", "-c", CORE_LIMIT])) == [1, 1, "refused"]


@ROOT_AND_BWRAP
def test_a_jobs_processes_are_what_the_kernel_kills_first_when_memory_runs_out_above_their_group():
    """A job within its own limit made of many mid-sized processes is never the largest one: where the agent's
    group (or the machine) ran out first, the kernel killed the agent, and every job of the node with it. Each of
    the job's processes now scores 1000 (an agent holding CAP_SYS_RESOURCE also makes that the job's floor)."""
    probe = "print(open('/proc/self/oom_score_adj').read().strip())"
    assert run_job(JOB_UID, ["/usr/bin/python3", "-c", probe]) == "1000"


def test_the_agent_raises_the_nodes_pid_count_past_what_its_attempts_may_start(tmp_path, settings):
    """A node kept the kernel's default kernel.pid_max, 32,768: eight attempts of E31_ATTEMPT_PIDS (4,096) could
    take every pid of the node, and the agent's own commands (mount, nft, bwrap) and every other job got EAGAIN."""
    settings.E31_ATTEMPT_PIDS = 4096
    pid_max = tmp_path / "pid_max"
    pid_max.write_text("32768\n")
    needed = 4096 * 8 + sandbox.NODE_PIDS
    assert sandbox.raise_pid_max(attempts=8, path=pid_max) == (
        f"raised kernel.pid_max from 32,768 to {needed:,}, past what its 8 attempts may start"
    )
    assert sandbox.raise_pid_max(attempts=8, path=pid_max) == "" and int(pid_max.read_text()) == needed


def test_the_agent_lifts_the_nodes_socket_memory_ceiling_to_its_memory(tmp_path):
    """The node's one pool of TCP (and UDP) buffer memory, by default a tenth of memory: a job allowed more than that
    (one GPU's share of an eight-GPU node) could queue unread data until every socket of the node was refused
    memory, the agent's connections to the database and broker among them, and the node was fenced. Each job's
    buffers are charged to its own memory group (``cgroups``): the pool's ceiling rises to the node's memory."""
    tcp, udp, meminfo = tmp_path / "tcp_mem", tmp_path / "udp_mem", tmp_path / "meminfo"
    tcp.write_text("287907\t383877\t575814\n")
    udp.write_text("575814\t767755\t1151628\n")
    meminfo.write_text("MemTotal:       24564556 kB\nMemFree:        1000 kB\n")
    pages = 24564556 * 1024 // 4096
    said = sandbox.raise_socket_memory(paths=(tcp, udp), meminfo=meminfo)
    assert said == [f"raised {name}'s ceiling from {before:,} to {pages:,} pages, the node's memory"
                    for name, before in (("tcp_mem", 575814), ("udp_mem", 1151628))]  # fmt: skip
    assert tcp.read_text().split() == ["287907", "383877", str(pages)]  # its pressure thresholds kept
    assert sandbox.raise_socket_memory(paths=(tcp, udp), meminfo=meminfo) == []
