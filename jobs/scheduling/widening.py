"""Slightly more: an elastic job that declared ``max_gpus`` starts wider on GPUs that would otherwise idle.

Only when the pass leaves nothing waiting (every pending job starts now, no reservation, no
preemption): then no waiting job needs the idle GPUs, and a wider start delays nobody. The extra
GPUs are free GPUs of the nodes the start already uses (no new node joins a job), never claimed by
another start of the pass, and taken only where the node's memory and CPUs still cover the job's
larger share there. Pure standard library.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from jobs.scheduling.types import NodeView, PendingJob, Plan, Start, gpus_held, part_share


def widen(result: Plan, *, pending: Sequence[PendingJob], nodes: Sequence[NodeView]) -> Plan:
    """``result`` with its elastic starts widened up to their ``max_gpus`` where nothing else waits."""
    if result.reservations or result.preemptions or len(result.starts) < len(pending):
        return result  # something waits: checked first, since most passes end here
    wide = {p.job_id: p for p in pending if p.max_gpus and p.max_gpus > p.gpus}
    if not wide:
        return result
    room = _Room(nodes, result.starts, {p.job_id: p for p in pending})
    starts = [room.widen(s, wide[s.job_id]) if s.job_id in wide else s for s in result.starts]
    return replace(result, starts=starts)


class _Room:
    """Free GPUs, memory and CPUs per node once this pass's starts have taken theirs."""

    def __init__(
        self, nodes: Sequence[NodeView], starts: Sequence[Start], jobs: dict[int, PendingJob]
    ) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.free = {n.name: [i for i in n.free] for n in nodes}
        self.memory = {n.name: n.free_memory for n in nodes}
        self.cpus = {n.name: n.free_cpus for n in nodes}
        for s in starts:
            total = _held(s)
            for node, idx in s.gpus_by_node.items():
                self.free[node] = [i for i in self.free[node] if i not in idx]
                memory, cpus = self._share(jobs[s.job_id], node, len(idx), total)
                self.memory[node] -= memory
                self.cpus[node] -= cpus

    def _share(self, job: PendingJob, node: str, here: int, total: int) -> tuple[float, float]:
        n = self.nodes[node]
        shape = {"job_gpus": total, "node_gpus": n.gpus, "gpus_here": here}
        memory = part_share(declared=job.memory, node_total=n.memory, **shape) if n.memory else 0.0
        cpus = part_share(declared=job.cpus, node_total=n.cpus, **shape) if n.cpus else 0.0
        return memory, cpus

    def widen(self, start: Start, job: PendingJob) -> Start:
        gpus_by_node = {node: list(idx) for node, idx in start.gpus_by_node.items()}
        total = _held(start)
        for node, idx in gpus_by_node.items():
            while total < job.max_gpus and self.free[node] and self._fits(job, node, len(idx), total):
                idx.append(self.free[node].pop(0))
                total += 1
        return Start(job.job_id, {node: tuple(sorted(idx)) for node, idx in gpus_by_node.items()})

    def _fits(self, job: PendingJob, node: str, here: int, total: int) -> bool:
        """Whether one more GPU here leaves the node's memory and CPUs covering the job's part."""
        old_memory, old_cpus = self._share(job, node, here, total)
        memory, cpus = self._share(job, node, here + 1, total + 1)
        if memory - old_memory > self.memory[node] + 1e-6 or cpus - old_cpus > self.cpus[node] + 1e-6:
            return False
        self.memory[node] -= memory - old_memory
        self.cpus[node] -= cpus - old_cpus
        return True


def _held(start: Start) -> int:
    return gpus_held(start.gpus_by_node)
