"""Baseline policies for comparison, on the same engine and placement rules as the default.

Each has ``plan()``'s signature so the simulator can swap them in; none uses fair share or age.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter

from jobs.scheduling import placement, policy, types
from jobs.scheduling.types import NodeView, PendingJob, Plan, PolicyConfig, ReleaseMemo, RunningView

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
    config: PolicyConfig = types.DEFAULT_CONFIG,
    memo: ReleaseMemo | None = None,
) -> Plan:
    """Strict first-come-first-served: start in submit order, stop at the first job that waits."""
    return placement.schedule(
        now=now,
        nodes=nodes,
        running=running,
        order=sorted(pending, key=_by_submit),
        config=PolicyConfig(reserve_top=0, explain=config.explain),
        backfill=False,
        memo=memo,
    )


def easy(
    *,
    now: float,
    nodes: Sequence[NodeView],
    running: Sequence[RunningView],
    pending: Sequence[PendingJob],
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    config: PolicyConfig = types.DEFAULT_CONFIG,
    memo: ReleaseMemo | None = None,
) -> Plan:
    """EASY backfilling in submit order: the first waiting job holds a reservation, others backfill."""
    return placement.schedule(
        now=now,
        nodes=nodes,
        running=running,
        order=sorted(pending, key=_by_submit),
        config=PolicyConfig(reserve_top=1, explain=config.explain),
        memo=memo,
    )


def sjf(
    *,
    now: float,
    nodes: Sequence[NodeView],
    running: Sequence[RunningView],
    pending: Sequence[PendingJob],
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    config: PolicyConfig = types.DEFAULT_CONFIG,
    memo: ReleaseMemo | None = None,
) -> Plan:
    """Shortest declared hours first, with EASY backfilling behind the first waiting job."""
    return placement.schedule(
        now=now,
        nodes=nodes,
        running=running,
        order=sorted(pending, key=_by_declared_hours),
        config=PolicyConfig(reserve_top=1, explain=config.explain),
        memo=memo,
    )


POLICIES: dict[str, types.Policy] = {"default": policy.plan, "fcfs": fcfs, "easy": easy, "sjf": sjf}
