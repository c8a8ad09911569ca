"""The node agent's side of resource limits: what a node offers, and each attempt's cgroups.

The mechanism is ``jobs.cgroups``; the arithmetic of shares is the scheduler's own
(``jobs.scheduling.types.part_share``), so what is placed is what is enforced. Here the two
meet the rows: an attempt's limits come from its job's declaration or its node's share, and a
node advertises its memory and CPUs (discovered, capped by ``--memory``/``--cpus``).
"""

import functools
import logging
import os
import shutil
from pathlib import Path

from django.conf import settings

from jobs import attempt_space, cgroups, selectors, units
from jobs.models import Allocation, Job
from jobs.scheduling import types

log = logging.getLogger(__name__)
PREFIX = "e31"
NONE = "none: "  # how a node's limits begin where it bounds no attempt by cgroups
DISK_BOUNDED = "disk bounded"  # what a node's limits say when its attempts get a bounded space


@functools.cache
def hierarchies() -> dict[str, cgroups.Hierarchy]:
    """Found once per agent process: v2 may move the agent into a leaf group, after which its own path differs."""
    return cgroups.detect()


def probe(node_name: str) -> str:
    """What this node enforces, for the pool page: a probe group is made and removed, as a job's would be."""
    found = hierarchies()
    if not found:
        return f"{NONE}no cgroup controllers found"
    cgroups.remove_stale(found, prefix=PREFIX, node=node_name)
    group = cgroups.AttemptGroup(found, prefix=PREFIX, name=f"{node_name}-probe")
    try:
        group.create(cgroups.Limits(memory_bytes=64 * 2**20, cpus=1, pids=64))
    except cgroups.SharedGroup as exc:
        return f"{NONE}{exc.strerror}"
    except OSError as exc:
        return f"{NONE}cgroups cannot be created here ({exc.strerror or exc})"
    finally:
        group.remove(timeout_s=1)
    return cgroups.describe(found)


def probe_space(jobs_dir: Path) -> str:
    """'' when attempt space is bounded here, else why not. Spaces of earlier attempts stay mounted
    across an agent's restart (the kernel keeps them): their outputs may still be awaiting delivery."""
    jobs_dir.mkdir(parents=True, exist_ok=True)
    return attempt_space.probe(jobs_dir)


def disk_shortfall(jobs_dir: Path, gpus: int) -> str:
    """'' when the disk under ``jobs_dir`` holds an attempt space per GPU (scratch and log, no output
    declared), else how many it holds: spaces are taken on the disk when made, and past that they are refused."""
    each = space_bytes(0)
    free = _free_bytes(jobs_dir)
    if free >= each * gpus:
        return ""
    return (
        f"its disk has {units.format_size(free)} free: room for {free // each} attempt space(s) of "
        f"{units.format_size(each)} (E31_SCRATCH_BYTES and the log cap) for {gpus} GPU(s); attempts past "
        "that go back to the queue"
    )


def attempt_limits(allocation: Allocation) -> cgroups.Limits:
    """This part's bounds: the job's declared memory and CPUs split by the GPUs its attempt holds
    (an elastic job on fewer GPUs than declared gets its whole declaration), else the node's share."""
    job, node, here = allocation.job, allocation.node, len(allocation.gpu_indices)
    shared = {"job_gpus": selectors.attempt_gpus(allocation), "node_gpus": node.gpus, "gpus_here": here}
    memory = types.part_share(declared=job.memory_bytes, node_total=node.memory_bytes, **shared)
    cpus = types.part_share(declared=job.cpus, node_total=node.cpus, **shared)
    return cgroups.Limits(memory_bytes=int(memory), cpus=cpus, pids=settings.E31_ATTEMPT_PIDS)


def open_group(allocation: Allocation) -> cgroups.AttemptGroup:
    """Creates the attempt's groups with its limits; where this node has no usable cgroups, an empty group."""
    name = f"{allocation.node.name}-{allocation.job_id}-{allocation.attempt}"
    group = cgroups.AttemptGroup(hierarchies(), prefix=PREFIX, name=name)
    try:
        group.create(attempt_limits(allocation))
    # An unprivileged agent (the embedded default), or one sharing its v2 group: shown on the pool page. A node
    # that advertised limits never runs an attempt without them: the attempt fails instead.
    except (PermissionError, cgroups.SharedGroup) as exc:
        if not allocation.node.limits.startswith(NONE):
            raise
        log.warning("attempt %s runs without cgroup limits: %s", name, exc)
        group.remove(timeout_s=1)
        return cgroups.AttemptGroup({}, prefix=PREFIX, name=name)
    return group


def bound_space(root: Path, job: Job) -> bool:
    """The attempt's directory becomes a filesystem of its own: declared output + scratch + log."""
    return attempt_space.bound(root, size=space_bytes(job.output_bytes))


def space_bytes(output_bytes: int) -> int:
    """What one part's attempt space takes on its node's disk, for a job declaring ``output_bytes``."""
    return attempt_space.size_for(
        output_bytes=output_bytes,
        scratch_bytes=settings.E31_SCRATCH_BYTES,
        log_bytes=settings.E31_LOG_CAP_BYTES,
    )


def disk_free(jobs_dir: Path, node_limits: str) -> int | None:
    """Bytes the node's disk can still give attempt spaces (what any user may take: see ``_free_bytes``); None
    where it does not bound them (nothing taken up front there, so nothing the scheduler should count), or where
    the disk could not be read."""
    usage = _spaces_disk(jobs_dir, node_limits)
    return None if usage is None else usage.free


def disk_size(jobs_dir: Path, node_limits: str) -> int:
    """What the disk under attempt spaces holds in all (no space larger can be made there, however much frees);
    0 where the node does not bound spaces, or the disk could not be read."""
    usage = _spaces_disk(jobs_dir, node_limits)
    return 0 if usage is None else usage.total


def _spaces_disk(jobs_dir: Path, node_limits: str):
    """The disk under attempt spaces, measured; None where the node does not bound them, or it could not be read."""
    if DISK_BOUNDED not in node_limits:
        return None
    try:
        return shutil.disk_usage(jobs_dir)
    except OSError:
        log.warning("the disk under %s could not be measured", jobs_dir, exc_info=True)
        return None


def _free_bytes(path: Path) -> int:
    """What the disk gives anyone: not counting the blocks a filesystem keeps for root, which a root agent's
    images could take too, since a machine's provider may keep far more back that way (seen: 162 of 246 GB)."""
    return shutil.disk_usage(path).free


def node_memory(cap: int | None = None) -> int:
    """What the node's jobs may hold between them: physical memory, or the agent's own memory cgroup limit where
    lower, less the reserve that the agent, its deliveries and the system need (a job on every GPU is given all of
    it); or the operator's cap, where lower."""
    found = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    memory = hierarchies().get("memory")
    if memory is not None:
        own_limit = _own_memory_limit(memory)
        if own_limit:
            found = min(found, own_limit)
    offered = found - reserved_memory(found)
    return min(offered, cap) if cap else offered


def reserved_memory(found: int) -> int:
    """E31_NODE_RESERVED_MEMORY_BYTES, else a twentieth of what was found and at least 512 MiB; never over half of it."""
    reserve = settings.E31_NODE_RESERVED_MEMORY_BYTES
    if reserve is None:
        reserve = max(found // 20, 512 * 2**20)
    return min(reserve, found // 2)


def node_cpus(cap: float | None = None) -> float:
    found = float(len(os.sched_getaffinity(0)))
    return min(found, cap) if cap else found


def _own_memory_limit(memory: cgroups.Hierarchy) -> int:
    group = memory.mount / memory.own
    filename = "memory.max" if memory.version == 2 else "memory.limit_in_bytes"
    try:
        text = Path(group, filename).read_text().strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0
