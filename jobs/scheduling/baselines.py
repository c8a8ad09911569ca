"""Baseline policies for comparison, on the same engine and placement rules as the default.

Each has ``plan()``'s signature so the simulator can swap them in; none uses fair share or age.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter

from jobs.scheduling import policy
from jobs.scheduling.policy import NodeView, PendingJob, Plan, PolicyConfig, RunningView

PolicyFn = Callable[..., Plan]


_by_submit = attrgetter("submitted_at", "job_id")
_by_declared_hours = attrgetter("hours", "submitted_at", "job_id")


def fcfs(
    *,
    now: float,
    nodes: Sequence[NodeView],
    running: Sequence[RunningView],
    pending: Sequence[PendingJob],
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    config: PolicyConfig = policy.DEFAULT_CONFIG,
) -> Plan:
    """Strict first-come-first-served: start in submit order, stop at the first job that waits."""
    return policy.schedule(
        now=now,
        nodes=nodes,
        running=running,
        order=sorted(pending, key=_by_submit),
        config=PolicyConfig(reserve_top=0, explain=config.explain),
        backfill=False,
    )


def easy(
    *,
    now: float,
    nodes: Sequence[NodeView],
    running: Sequence[RunningView],
    pending: Sequence[PendingJob],
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    config: PolicyConfig = policy.DEFAULT_CONFIG,
) -> Plan:
    """EASY backfilling in submit order: the first waiting job holds a reservation, others backfill."""
    return policy.schedule(
        now=now,
        nodes=nodes,
        running=running,
        order=sorted(pending, key=_by_submit),
        config=PolicyConfig(reserve_top=1, explain=config.explain),
    )


def sjf(
    *,
    now: float,
    nodes: Sequence[NodeView],
    running: Sequence[RunningView],
    pending: Sequence[PendingJob],
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    config: PolicyConfig = policy.DEFAULT_CONFIG,
) -> Plan:
    """Shortest declared hours first, with EASY backfilling behind the first waiting job."""
    return policy.schedule(
        now=now,
        nodes=nodes,
        running=running,
        order=sorted(pending, key=_by_declared_hours),
        config=PolicyConfig(reserve_top=1, explain=config.explain),
    )


POLICIES: dict[str, PolicyFn] = {"default": policy.plan, "fcfs": fcfs, "easy": easy, "sjf": sjf}
