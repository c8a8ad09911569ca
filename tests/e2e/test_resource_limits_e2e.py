"""What a job may consume is bounded: memory, processes, CPU and disk, per attempt, by cgroups.

Issue 13 point 8: inside the sandbox a 1.5 GB allocation and 300 processes succeeded (pids
bounded only by the host default, no cgroup at all). Real agents, real bubblewrap, real cgroups.
"""

from pathlib import Path

import pytest
from django.utils import timezone

from jobs import declaration, nodes, services
from jobs.models import Node
from tests.e2e.conftest import wait_for, wait_for_state
from tests.factories import MembershipFactory, TeamFactory, UserFactory

# Agents start slowly on a loaded machine; each job in these tests is bounded by its own waits.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
ATTEMPT_PIDS = 128


@pytest.fixture
def bounded_env(monkeypatch):
    """Agents of this module bound each attempt to 128 processes and 20 MB of scratch (the defaults are larger)."""
    monkeypatch.setenv("E31_ATTEMPT_PIDS", str(ATTEMPT_PIDS))
    monkeypatch.setenv("E31_SCRATCH_BYTES", str(20 * 10**6))


@pytest.fixture
def member(bounded_env, live_pool):
    return MembershipFactory(
        team=TeamFactory(name="limits", slug="limits"), user=UserFactory(username="lim")
    ).user


@pytest.fixture
def one_node(live_pool):
    """Both jobs of a test share one node: the second node takes no new work."""
    nodes.set_node_state(
        name=live_pool.nodes[1], target=Node.NodeState.DRAINING, now=timezone.now(), actor="test"
    )
    return live_pool.nodes[0]


def submit(member, argv, *, request=None, hours=1.0, name="limits", output_bytes=1000):
    from django.conf import settings

    team = member.memberships.first().team
    spec = declaration.validate(
        {
            "name": name, "work": {"argv": argv},
            "request": {"gpus": 1, "hours": hours, **(request or {})},
            "output": {"uri": f"file://{settings.E31_OUTPUT_ROOTS[0]}/{team.slug}/{name}", "bytes": output_bytes},
        },
        limits=services.pool_limits(team=team),
    )  # fmt: skip
    return services.submit_job(team=team, user=member, spec=spec, now=timezone.now())


def py(code: str) -> list[str]:
    return ["/usr/bin/python3", "-c", code]


ALLOCATE_1_5_GB = "b = b'x' * 1_500_000_000; print('allocated', len(b), flush=True)"
SPAWN_300 = """
import subprocess
procs = [subprocess.Popen(['sleep', '30']) for _ in range(300)]
print('spawned', len(procs), flush=True)
for p in procs: p.kill()
"""


def test_reproduction_a_1_5_gb_allocation_inside_a_1_gb_job_is_stopped_as_out_of_memory(member, one_node):
    job = wait_for_state(
        submit(member, py(ALLOCATE_1_5_GB), request={"memory": "1 GB"}).id, "released", timeout=60
    )
    assert "allocated" not in job.log_tail, job.log_tail
    assert job.end_reason == "out_of_memory", (job.end_reason, job.log_tail)


def test_reproduction_300_processes_do_not_fit_under_the_attempts_pids_limit(member, one_node):
    job = wait_for_state(submit(member, py(SPAWN_300)).id, "released", timeout=60)
    assert "spawned 300" not in job.log_tail, job.log_tail
    assert job.end_reason == "failed" and "Resource temporarily unavailable" in job.log_tail, job.log_tail
    assert wait_for(lambda: Node.objects.get(name=one_node).state == "up", what="node up")


HOG = "chunks = []\nwhile True:\n    chunks.append(b'x' * 10_000_000)"
FORK_BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
NEIGHBOUR = "import time; time.sleep(8); print('neighbour done', flush=True)"


def _attempt_pids(node: str, job_id: int) -> Path:
    return Path("/sys/fs/cgroup/pids/e31") / f"{node}-{job_id}-1"


def test_a_memory_hog_ends_out_of_memory_while_a_neighbour_on_its_node_finishes(
    member, one_node, live_pool, member_client
):
    neighbour = submit(member, py(NEIGHBOUR), name="neighbour")
    wait_for_state(neighbour.id, "running")
    hog = wait_for_state(submit(member, py(HOG), request={"memory": "256 MB"}, name="hog").id, "released")
    assert hog.end_reason == "out_of_memory" and "went over its memory limit" in hog.end_detail, hog.log_tail
    neighbour = wait_for_state(neighbour.id, "released")
    assert neighbour.end_reason == "succeeded" and "neighbour done" in neighbour.log_tail
    assert {a.node.name for j in (hog, neighbour) for a in j.allocations.all()} == {one_node}
    assert live_pool.procs[one_node].poll() is None  # the agent kept running
    assert Node.objects.get(name=one_node).state == "up"
    member_client.force_login(member)
    page = member_client.get(f"/jobs/{hog.id}/").content.decode()
    assert "out_of_memory" in page and "the kernel stopped it" in page


def test_a_fork_bomb_is_held_at_the_pids_limit_and_ends_while_a_neighbour_on_its_node_finishes(
    member, one_node, live_pool
):
    neighbour = submit(member, py(NEIGHBOUR), name="neighbour")
    wait_for_state(neighbour.id, "running")
    bomb = submit(member, py(FORK_BOMB), hours=12 / 3600, name="bomb")  # a twelve-second limit
    wait_for_state(bomb.id, "running")
    group = _attempt_pids(one_node, bomb.id)
    refused = wait_for(lambda: int(_events_max(group)), timeout=20, what="the pids limit to refuse forks")
    assert 0 < int((group / "pids.current").read_text()) <= ATTEMPT_PIDS and refused > 0
    neighbour = wait_for_state(neighbour.id, "released")
    assert neighbour.end_reason == "succeeded" and "neighbour done" in neighbour.log_tail
    bomb = wait_for_state(bomb.id, "released", timeout=60)
    assert bomb.end_reason == "timed_out"
    assert wait_for(lambda: not group.exists(), timeout=10, what="the attempt's group to be removed")
    assert live_pool.procs[one_node].poll() is None and Node.objects.get(name=one_node).state == "up"


def _events_max(group: Path) -> str:
    try:
        return (group / "pids.events").read_text().split()[1]
    except (OSError, IndexError):
        return "0"


FILL_DISK = """
import os
with open(os.path.join(os.environ['HOME'], 'fill'), 'wb') as out:
    for i in range(1000):
        out.write(b'x' * 1_000_000)
        out.flush()
print('wrote 1 GB', flush=True)
"""


def test_a_job_that_writes_past_its_space_fails_there_while_a_neighbour_on_its_node_finishes(
    member, one_node, live_pool
):
    neighbour = submit(member, py(NEIGHBOUR), name="neighbour")
    wait_for_state(neighbour.id, "running")
    filler = wait_for_state(submit(member, py(FILL_DISK), name="filler").id, "released", timeout=60)
    assert filler.end_reason == "failed" and "No space left on device" in filler.log_tail, filler.log_tail
    assert "wrote 1 GB" not in filler.log_tail
    neighbour = wait_for_state(neighbour.id, "released")
    assert neighbour.end_reason == "succeeded" and "neighbour done" in neighbour.log_tail
    assert "disk bounded" in Node.objects.get(name=one_node).limits


WRITE_OUTPUT = """
import os, sys
with open(os.path.join(os.environ['E31_OUTPUT_DIR'], 'big.bin'), 'wb') as out:
    for i in range(int(sys.argv[1])):
        out.write(b'x' * 1_000_000)
        out.flush()
print('wrote all', flush=True)
"""


def test_reproduction_an_output_over_its_declaration_ends_output_failed_saying_so_even_past_its_space(
    member, one_node
):
    """Issue 13 point 6: output.bytes = 100 and 5 MB written. Past the attempt's space (100 bytes +
    20 MB scratch) the write gets ENOSPC first; the end reason still names the broken declaration."""
    within = submit(member, [*py(WRITE_OUTPUT), "5"], name="over", output_bytes=100)
    past = submit(member, [*py(WRITE_OUTPUT), "1000"], name="past-space", output_bytes=100)
    within, past = (wait_for_state(j.id, "released", timeout=90) for j in (within, past))
    assert (within.end_reason, within.exit_code) == ("output_failed", 0), within.log_tail
    assert "wrote 5,000,000 bytes, declared 100 (output.bytes)" in within.end_detail
    assert past.end_reason == "output_failed" and past.exit_code != 0, past.log_tail
    assert "No space left on device" in past.log_tail and "wrote all" not in past.log_tail
    assert "bytes, declared 100 (output.bytes)" in past.end_detail, past.end_detail
    assert not within.delivery_state and not past.delivery_state  # nothing of either is delivered
