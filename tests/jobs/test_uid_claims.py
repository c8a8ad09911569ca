"""Two agents on one machine never hand out the same job uid: each holds its range, and an overlapping one is refused."""

import subprocess
import sys

import pytest

from jobs import sandbox

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture(autouse=True)
def no_claims_yet(monkeypatch):
    monkeypatch.setattr(sandbox, "_CLAIMS", {})


def _live_agent_holding(registry, base, count):
    registry.mkdir(exist_ok=True)
    agent = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(registry / f"{base}-{count}")], stdout=subprocess.PIPE
    )
    assert agent.stdout.readline() == b"held\n"
    return agent


@pytest.mark.parametrize("base,count", [(200000, 1000), (200500, 10), (199000, 1001)])
def test_a_range_overlapping_a_live_agents_is_refused(tmp_path, base, count):
    agent = _live_agent_holding(tmp_path, 200000, 1000)
    try:
        with pytest.raises(sandbox.UidRangeTaken, match="another agent on this machine"):
            sandbox.claim_uids(sandbox.UidRange(base, count), tmp_path)
    finally:
        agent.kill()
        agent.wait()


def test_a_dead_agents_range_and_a_neighbouring_one_are_free(tmp_path):
    neighbour = _live_agent_holding(tmp_path, 201000, 1000)
    dead = _live_agent_holding(tmp_path, 200000, 1000)
    dead.kill()
    dead.wait()
    try:
        sandbox.claim_uids(sandbox.UidRange(200000, 1000), tmp_path)  # the lock died with its agent
    finally:
        neighbour.kill()
        neighbour.wait()
    # This process holds it now: another agent taking the same range is refused the lock.
    other = subprocess.run(
        [sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR);"
         "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)", str(tmp_path / "200000-1000")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert other.returncode != 0 and "BlockingIOError" in other.stderr
