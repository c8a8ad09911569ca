"""A job's OOM score: 1000, and a floor it cannot go below only where the agent holds CAP_SYS_RESOURCE. Where it
does not (a container's root may lack it), a job can write its score back to the agent's, and the pool page says so
rather than claim a floor the kernel does not keep."""

import os
import subprocess
import sys

from jobs import limits, sandbox
from jobs.management.commands import node_agent
from tests import machine

# As a job starts: the score written as root, the uid changed, then a program exec'd (which makes its /proc files its
# own again) that writes its score back to 0.
LOWER_AFTER_DROP = """
import os
open('/proc/self/oom_score_adj', 'w').write('1000')
os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)
os.execv('/bin/sh', ['sh', '-c', 'echo 0 > /proc/self/oom_score_adj 2>/dev/null; read v < /proc/self/oom_score_adj; echo $v'])
"""


def _status(tmp_path, cap_eff: str):
    status = tmp_path / "status"
    status.write_text(
        f"Name:\tagent\nCapInh:\t0000000000000000\nCapEff:\t{cap_eff}\nCapBnd:\t000001ffffffffff\n"
    )
    return status


def test_the_floor_is_read_from_the_agents_effective_capabilities(tmp_path):
    assert sandbox.floors_oom_score(_status(tmp_path, "000001ffffffffff"))
    # Every capability but CAP_SYS_RESOURCE (bit 24): a container's root.
    assert not sandbox.floors_oom_score(_status(tmp_path, "000001fffeffffff"))
    assert not sandbox.floors_oom_score(_status(tmp_path, "0000000000000000"))


@machine.needs(root=True)
def test_what_the_agent_reads_of_itself_is_what_the_kernel_keeps_for_a_job():
    # Whichever this machine is, with the capability or without it: the reading matches the kernel.
    lowered = subprocess.run(
        [sys.executable, "-c", LOWER_AFTER_DROP], capture_output=True, text=True, timeout=30, check=True
    ).stdout.strip()
    assert lowered == ("1000" if sandbox.floors_oom_score() else "0"), lowered


def test_a_node_whose_agent_cannot_floor_the_score_says_so_on_the_pool_page(monkeypatch, settings, tmp_path):
    settings.E31_AGENT_ROOT = tmp_path / "agents"
    monkeypatch.setattr(limits, "probe", lambda name: "memory v1, cpu v1, pids v1")
    monkeypatch.setattr(limits, "probe_space", lambda jobs_dir: "")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(sandbox, "floors_oom_score", lambda: False)
    label = node_agent._limits("gpu-01")
    assert sandbox.NO_OOM_FLOOR in label and label.endswith(limits.DISK_BOUNDED), label
    monkeypatch.setattr(sandbox, "floors_oom_score", lambda: True)
    assert node_agent._limits("gpu-01") == f"memory v1, cpu v1, pids v1; {limits.DISK_BOUNDED}"
