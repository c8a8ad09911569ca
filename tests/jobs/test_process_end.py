"""The end of a job's process: what the agent kills once it has exited, and never kills."""

import subprocess
from pathlib import Path

from jobs import sandbox


def _reuse_pid(pid: int) -> subprocess.Popen:
    """A new, unrelated process (another attempt's launcher: a session of its own) that gets ``pid``, as the
    kernel hands a reaped pid out again once its counter wraps (pid_max is 32768 on these machines)."""
    for _ in range(200):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
        if victim.pid == pid:
            return victim
        victim.kill()
        victim.wait()
    raise AssertionError(f"could not get pid {pid} again (a busy machine): rerun")


def test_killing_a_finished_jobs_tree_never_kills_the_process_that_got_its_pid_since():
    """A job exits; the agent reaps it (``proc.wait()`` in ``_run_bounded``) and only then calls
    ``sandbox.kill_tree(proc)``, which SIGKILLs ``proc.pid``, its /proc children and the process group
    ``proc.pid``. Once reaped, that pid is free: another team's attempt started meanwhile by another agent
    thread (bubblewrap in a new session, so pid == pgid) can hold it, and the agent kills it and its whole
    session. The kill must only reach a process the agent has not reaped yet (as Popen.send_signal does)."""
    finished = subprocess.Popen(["true"], start_new_session=True)
    finished.wait()
    victim = _reuse_pid(finished.pid)
    try:
        sandbox.kill_tree(finished)
        try:
            victim.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        assert victim.returncode is None, "another process that reused the finished job's pid was killed"
    finally:
        victim.kill()
        victim.wait()
