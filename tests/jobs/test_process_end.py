"""The end of a job's process: what the agent kills once it has exited, and never kills."""

import errno
import signal
import subprocess
import time
from pathlib import Path

import pytest

from jobs import sandbox


def test_killing_a_finished_jobs_tree_never_signals_its_reaped_pid(monkeypatch):
    """A job exits and is reaped; killing its tree afterwards SIGKILLed ``proc.pid``, its /proc children and
    the process group ``proc.pid``. Once reaped, that pid is free: another team's attempt started meanwhile
    (bubblewrap in a new session, so pid == pgid) can hold it, and the agent killed it and its whole session
    (seen with the pid forced back through /proc/sys/kernel/ns_last_pid). A reaped process is never signalled."""
    finished = subprocess.Popen(["true"], start_new_session=True)
    finished.wait()
    signalled = []
    monkeypatch.setattr(sandbox.os, "kill", lambda pid, sig: signalled.append(("kill", pid)))
    monkeypatch.setattr(sandbox.os, "killpg", lambda pid, sig: signalled.append(("killpg", pid)))
    sandbox.kill_tree(finished)
    assert signalled == []


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def test_what_a_job_left_in_its_process_group_is_killed_before_the_job_is_reaped():
    """A job starts a child in its own process group and exits 0. The agent waits for the exit without
    reaping (the zombie keeps its pid and group from being handed out), kills what is left in the group,
    then reaps: the exit code is the job's, and the child is gone."""
    job = subprocess.Popen(
        ["sh", "-c", "sleep 300 & echo $!; exit 0"], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    child = int(job.stdout.readline())
    assert sandbox.exited(job) in (False, True)  # never reaps: asking twice is safe
    deadline = time.monotonic() + 10
    while not sandbox.exited(job) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert job.returncode is None  # exited, not reaped: its pid still names its group
    assert sandbox.reap(job) == 0
    deadline = time.monotonic() + 10
    while _state(child) not in ("gone", "Z") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _state(child) in ("gone", "Z"), "the job's child outlived it"
    job.stdout.close()


def test_a_pid_the_scan_found_but_another_process_holds_now_is_never_signalled():
    """The agent scans /proc for the job's processes, then signals each pid. A job forking and exiting fast can
    free a pid it listed; were the numbers to wrap meanwhile, another process (another team's attempt, the
    database, the agent) would hold it and be TERMed or KILLed. Each process is signalled only if it is still
    the one the scan found: its pid pinned by a pidfd, and its start time the scan's."""
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        started = sandbox.start_ticks(stranger.pid)
        sandbox._send([sandbox.Found(stranger.pid, started + 1)], signal.SIGKILL)  # the scan saw another one
        time.sleep(0.2)
        assert stranger.poll() is None, "a process the scan never found was killed"
        sandbox._send(
            [sandbox.Found(stranger.pid, started)], signal.SIGKILL
        )  # the very process the scan found
        assert stranger.wait(timeout=5) == -signal.SIGKILL
    finally:
        stranger.kill()
        stranger.wait()


def test_the_scan_finds_each_descendant_with_its_start_time():
    parent = subprocess.Popen(["sh", "-c", "sleep 30 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while not (found := sandbox.descendants(parent.pid)) and time.monotonic() < deadline:
            time.sleep(0.02)
        [child] = found
        assert child.start == sandbox.start_ticks(child.pid) > 0
    finally:
        sandbox.kill_tree(parent)
        parent.wait()


@pytest.mark.parametrize("refused", ["pidfd_open", "pidfd_send_signal"])
@pytest.mark.parametrize(
    "refusal", [OSError(errno.ENOSYS, "no pidfd"), PermissionError(errno.EPERM, "seccomp")]
)
def test_where_pidfds_are_refused_the_scanned_process_is_still_signalled_once_its_start_time_matches(
    monkeypatch, refusal, refused
):
    """A kernel before 5.3, or a seccomp profile that blocks pidfd_open (or the send): the error escaped terminate,
    kill_tree and reap, and the job's processes were neither signalled nor reaped. The start time is checked, then the pid
    signalled: a smaller window than none at all, and the job still ends."""
    owner = sandbox.os if refused == "pidfd_open" else sandbox.signal
    monkeypatch.setattr(owner, refused, lambda *args: (_ for _ in ()).throw(refusal))
    stranger, target = subprocess.Popen(["sleep", "30"]), subprocess.Popen(["sleep", "30"])
    try:
        sandbox._send([sandbox.Found(stranger.pid, sandbox.start_ticks(stranger.pid) + 1)], signal.SIGKILL)
        sandbox._send([sandbox.Found(target.pid, sandbox.start_ticks(target.pid))], signal.SIGKILL)
        assert target.wait(timeout=5) == -signal.SIGKILL
        assert stranger.poll() is None
    finally:
        for proc in (stranger, target):
            proc.kill()
            proc.wait()
