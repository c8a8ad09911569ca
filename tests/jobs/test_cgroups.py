"""Finding each controller (v2 where enabled, else v1) and writing an attempt's limits, on fake cgroupfs trees."""

import errno
from pathlib import Path

import pytest
from django.utils import timezone

from jobs import cgroups, limits
from jobs.models import Allocation
from jobs.scheduling import types
from tests.factories import JobFactory, NodeFactory

LIMITS = cgroups.Limits(memory_bytes=512 * 10**6, cpus=2.5, pids=256)


def _v1(root: Path, *controllers: str) -> None:
    for controller in controllers:
        (root / controller).mkdir(parents=True)
        (root / controller / "cgroup.procs").write_text("")


def _v2(mount: Path, offered: str) -> None:
    mount.mkdir(parents=True, exist_ok=True)
    (mount / "cgroup.controllers").write_text(offered + "\n")
    (mount / "cgroup.subtree_control").write_text("")


def _self(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "self-cgroup"
    path.write_text(text)
    return path


def test_a_machine_like_these_uses_v1_for_every_controller_the_v2_mount_does_not_offer(tmp_path):
    root = tmp_path / "cgroup"
    _v1(root, "memory", "cpu", "pids", "devices")
    _v2(root / "unified", "hugetlb")
    own = _self(tmp_path, "8:pids:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n")
    found = cgroups.detect(root=root, self_cgroup=own)
    assert {c: h.version for c, h in found.items()} == {"memory": 1, "cpu": 1, "pids": 1}
    assert found["memory"].parent("e31") == root / "memory" / "process_api/abc" / "e31"
    assert found["pids"].parent("e31") == root / "pids" / "." / "e31"
    assert cgroups.describe(found) == "memory v1, cpu v1, pids v1"


def test_a_v2_only_machine_uses_the_unified_mount_at_the_root(tmp_path):
    root = tmp_path / "cgroup"
    _v2(root, "cpuset cpu io memory hugetlb pids rdma misc")
    found = cgroups.detect(root=root, self_cgroup=_self(tmp_path, "0::/system.slice/e31-agent.service\n"))
    assert {c: h.version for c, h in found.items()} == {"memory": 2, "cpu": 2, "pids": 2}
    assert found["cpu"].parent("e31") == root / "system.slice/e31-agent.service" / "e31"


def test_v2_wins_where_the_unified_mount_offers_the_controller_and_v1_serves_the_rest(tmp_path):
    root = tmp_path / "cgroup"
    _v1(root, "memory", "cpu", "pids")
    _v2(root / "unified", "memory pids")
    found = cgroups.detect(root=root, self_cgroup=_self(tmp_path, "4:memory:/\n1:cpu:/\n8:pids:/\n0::/\n"))
    assert {c: h.version for c, h in found.items()} == {"memory": 2, "cpu": 1, "pids": 2}


def test_combined_v1_mounts_such_as_cpu_cpuacct_are_read_from_proc_self_cgroup(tmp_path):
    root = tmp_path / "cgroup"
    _v1(root, "cpu,cpuacct")
    (root / "cpu").symlink_to(root / "cpu,cpuacct")
    found = cgroups.detect(root=root, self_cgroup=_self(tmp_path, "2:cpu,cpuacct:/agents\n"))
    assert found["cpu"].version == 1 and found["cpu"].own == Path("agents")


def test_a_machine_without_cgroups_offers_nothing_and_says_so(tmp_path):
    found = cgroups.detect(root=tmp_path / "none", self_cgroup=_self(tmp_path, ""))
    assert found == {}
    assert cgroups.describe(found) == "memory unavailable, cpu unavailable, pids unavailable"


def test_v1_limits_bound_memory_without_swap_cpu_share_and_quota_and_processes(tmp_path):
    root = tmp_path / "cgroup"
    _v1(root, "memory", "cpu", "pids")
    found = cgroups.detect(root=root, self_cgroup=_self(tmp_path, "4:memory:/\n1:cpu:/\n8:pids:/\n"))
    for path in (root / "memory" / "e31" / "job-1",):
        path.mkdir(parents=True)
        (path / "memory.memsw.limit_in_bytes").write_text("")  # swap accounting is on
        (path / "memory.kmem.tcp.limit_in_bytes").write_text("")  # and socket memory may be charged
    group = cgroups.AttemptGroup(found, prefix="e31", name="job-1")
    group.create(LIMITS)
    memory, cpu, pids = (root / c / "e31" / "job-1" for c in ("memory", "cpu", "pids"))
    assert (memory / "memory.limit_in_bytes").read_text() == "512000000"
    assert (memory / "memory.memsw.limit_in_bytes").read_text() == "512000000"
    assert (memory / "memory.kmem.tcp.limit_in_bytes").read_text() == "512000000"
    assert (memory / "memory.swappiness").read_text() == "0"
    assert (cpu / "cpu.shares").read_text() == "2560"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "250000"
    assert (cpu / "cpu.cfs_period_us").read_text() == "100000"
    assert (pids / "pids.max").read_text() == "256"
    assert group.procs_files() == sorted(str(p / "cgroup.procs") for p in (memory, cpu, pids))


def test_v2_limits_are_written_in_one_group_with_the_controllers_delegated_down_to_it(tmp_path):
    root = tmp_path / "cgroup"
    _v2(root, "cpu memory pids")
    found = cgroups.detect(root=root, self_cgroup=_self(tmp_path, "0::/\n"))
    (root / "e31" / "job-1").mkdir(parents=True)
    (root / "e31" / "job-1" / "memory.swap.max").write_text("max")
    group = cgroups.AttemptGroup(found, prefix="e31", name="job-1")
    group.create(LIMITS)
    path = root / "e31" / "job-1"
    assert (path / "memory.max").read_text() == "512000000"
    assert (path / "memory.swap.max").read_text() == "0"
    assert (path / "memory.oom.group").read_text() == "1"
    assert (path / "cpu.weight").read_text() == "250"
    assert (path / "cpu.max").read_text() == "250000 100000"
    assert (path / "pids.max").read_text() == "256"
    assert (root / "e31" / "cgroup.subtree_control").read_text().startswith("+")
    assert group.procs_files() == [str(path / "cgroup.procs")]


@pytest.mark.parametrize(
    ("version", "filename", "text"),
    [
        (1, "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"),
        (2, "memory.events", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n"),
    ],
)
def test_an_oom_kill_is_read_from_the_groups_own_counter(tmp_path, version, filename, text):
    hierarchy = cgroups.Hierarchy("memory", version, tmp_path, Path("."))
    group = cgroups.AttemptGroup({"memory": hierarchy}, prefix="e31", name="job-1")
    assert group.oom_kills() == 0  # no counter yet: nothing was killed
    (tmp_path / "e31" / "job-1").mkdir(parents=True)
    (tmp_path / "e31" / "job-1" / filename).write_text(text)
    assert group.oom_kills() == (2 if version == 1 else 1)


def test_an_unknown_memory_or_cpu_figure_leaves_that_controller_unset(tmp_path):
    root = tmp_path / "cgroup"
    _v1(root, "memory", "cpu")
    found = cgroups.detect(root=root, self_cgroup=_self(tmp_path, "4:memory:/\n1:cpu:/\n"))
    cgroups.AttemptGroup(found, prefix="e31", name="j").create(cgroups.Limits(0, 0, 64))
    assert not (root / "memory" / "e31" / "j" / "memory.limit_in_bytes").exists()
    assert not (root / "cpu" / "e31" / "j" / "cpu.shares").exists()


def test_a_part_gets_its_declared_amount_split_by_gpus_or_else_the_nodes_share():
    declared = types.part_share(declared=48e9, job_gpus=12, node_total=64e9, node_gpus=8, gpus_here=4)
    share = types.part_share(declared=None, job_gpus=12, node_total=64e9, node_gpus=8, gpus_here=4)
    assert (declared, share) == (16e9, 32e9)


def test_an_agent_starting_again_removes_the_groups_its_dead_predecessor_left_and_no_others(tmp_path):
    root = tmp_path / "cgroup"
    _v1(root, "memory", "pids")
    found = cgroups.detect(root=root, self_cgroup=_self(tmp_path, "4:memory:/\n8:pids:/\n"))
    names = ("gpu-1-7-1", "gpu-1-8-2", "gpu-10-3-1", "gpu-1-2-5-1")  # the last two: nodes gpu-10, gpu-1-2
    for controller in ("memory", "pids"):
        for name in names:  # empty, as the kernel shows a group whose processes are gone
            (root / controller / "e31" / name).mkdir(parents=True)
    removed = cgroups.remove_stale(found, prefix="e31", node="gpu-1")
    assert sorted(removed) == ["memory:gpu-1-7-1", "memory:gpu-1-8-2", "pids:gpu-1-7-1", "pids:gpu-1-8-2"]
    assert sorted(p.name for p in (root / "memory" / "e31").iterdir()) == ["gpu-1-2-5-1", "gpu-10-3-1"]


@pytest.mark.django_db
def test_an_elastic_job_on_fewer_gpus_than_declared_gets_its_whole_declared_memory_and_cpus():
    """64 GB and 16 CPUs for 8 GPUs, at least 4; started on 4 it is bounded at 64 GB and 16 CPUs, not half."""
    job = JobFactory(gpus=8, min_gpus=4, memory_bytes=64 * 10**9, cpus=16.0, state="running", attempt=1)
    node = NodeFactory(gpus=4, memory_bytes=128 * 10**9, cpus=32)
    allocation = Allocation.objects.create(
        job=job, attempt=1, node=node, gpu_indices=[0, 1, 2, 3], rented_at=timezone.now()
    )
    bounds = limits.attempt_limits(Allocation.objects.select_related("job", "node").get(id=allocation.id))
    assert (bounds.memory_bytes, bounds.cpus) == (64 * 10**9, 16.0)


@pytest.fixture
def shared_v2_group(tmp_path, monkeypatch):
    """A v2 machine where the agent's group (/session-7) holds other processes: v2 refuses to delegate
    controllers below it (EBUSY, even after the agent moved itself to a leaf)."""
    root = tmp_path / "cgroup"
    _v2(root, "cpu memory pids")
    found = cgroups.detect(root=root, self_cgroup=_self(tmp_path, "0::/session-7\n"))
    (root / "session-7").mkdir()
    write = cgroups._write

    def busy(path: Path, value: str) -> None:
        if path.name == "cgroup.subtree_control" and path.parent == root / "session-7":
            raise OSError(errno.EBUSY, "Device or resource busy")
        write(path, value)

    monkeypatch.setattr(cgroups, "_write", busy)
    monkeypatch.setattr(limits, "hierarchies", lambda: found)
    monkeypatch.setattr(limits, "attempt_limits", lambda allocation: LIMITS)


def _allocation(node_limits: str) -> Allocation:
    node = NodeFactory.build(name="gpu-1", limits=node_limits)  # what the node advertised at start
    return Allocation(node=node, job=JobFactory.build(id=4), attempt=1, gpu_indices=[0])


def test_a_v2_agent_sharing_its_group_with_other_processes_runs_attempts_unbounded_and_says_how_to_fix_it(
    shared_v2_group,
):
    # Seen on a GPU machine: the agent ran in one group with the shell that started it.
    said = limits.probe("gpu-1")
    assert said.startswith("none: ")
    assert "/session-7 holds other processes" in said and "Delegate=yes" in said
    assert limits.open_group(_allocation(said)).procs_files() == []


def test_a_node_that_advertises_limits_never_runs_an_attempt_without_them(shared_v2_group):
    # Its controllers taken away after the probe (a unit reloaded without Delegate=yes) and a process put in
    # its group: the attempt fails rather than run unbounded under a pool page that says "memory v2".
    with pytest.raises(cgroups.SharedGroup):
        limits.open_group(_allocation("memory v2, cpu v2, pids v2; disk bounded"))
