"""The scheduling policy: which queued jobs get GPUs now, where, and when the rest can expect to.

Pure core: standard library only, no clock (``now`` is POSIX seconds passed in), no I/O. The same
``plan()`` runs in the live scheduler pass and in trace replay (``jobs.scheduling.simulate``).

The default policy, in order of precedence:

1. **Starvation bound** - a job queued longer than ``starvation_factor`` times the queue's mean
   wait (and at least ``starvation_s``) goes to the front (oldest first) and holds a reservation
   whatever its team's fair share or its size (at most ``max_reservations`` per pass; later ones
   get theirs as those ahead start). Relative, so an overloaded queue keeps its priority order.
2. **Priority** - ``fairshare_weight * F + age_weight * days_waited + length_weight * S
   + slowdown_weight * hours_waited / declared_hours`` where
   ``F = 2 ** -(usage_share / share)`` (usage decayed with ``half_life_s``, both normalised over the
   teams with queued or running jobs) and ``S = 1 / (1 + log2(1 + declared hours))`` favours short
   requests, because a short job's slowdown suffers most from a wait. Width (GPUs) is not
   penalised: wide jobs already wait for space, and their reservations protect them. The last
   term is the job's expected slowdown so far (declared hours floored at 15 minutes): it grows
   fastest for short jobs and never stops growing, so no job is overtaken by newer ones forever.
3. **Reservations and backfill** - the top ``reserve_top`` blocked jobs and the starved ones (up to
   ``max_reservations`` in all) get a reservation, in priority order: each at the earliest time,
   by declared hours, at or after the one before it when its GPUs are free, on named nodes
   (conservative backfilling for the few that matter; one walk over releases per pass).
   Any other job may start now only if it ends (by declared hours) before the earliest
   reservation, or uses idle GPUs no reservation counts on.
4. **Placement** - a job that fits one node stays on one node, best-fit (fewest free GPUs left);
   nodes caching the job's datasets first. Larger jobs take whole free nodes of the largest size,
   plus a best-fit node for any remainder.
5. **Elastic and backlog jobs** - an elastic job that cannot start at full size starts now with as
   many GPUs as one placement gives (at least ``min_gpus``); one that declared ``max_gpus`` starts
   wider on its nodes' idle GPUs when the pass leaves nothing waiting (``widening``). Preemptible ("backlog") jobs are
   placed after every other job, on any idle GPU, and count as free when reservations are made: a
   reservation that could start now on their GPUs preempts them (ids in ``Plan.preemptions``).

Invariants of every ``Plan``: starts use only GPUs free now on schedulable nodes, none twice; a
backfilled start never delays a reservation (judged by declared hours); every pending job has an
estimate, with ``start_at`` None only when no time can be told: the pool as it is can never place it (too large,
drained, no node of its GPU model), or it waits for memory or CPUs that no running job is due to free, or for a job
that itself has no time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jobs.scheduling import explanation, gates, placement, priority, widening
from jobs.scheduling.types import (
    DEFAULT_CONFIG,
    NodeView,
    PendingJob,
    Plan,
    PolicyConfig,
    ReleaseMemo,
    RunningView,
    by_submit,
)


def plan(
    *,
    now: float,
    nodes: Sequence[NodeView],
    running: Sequence[RunningView],
    pending: Sequence[PendingJob],
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    config: PolicyConfig = DEFAULT_CONFIG,
    memo: ReleaseMemo | None = None,
) -> Plan:
    """One pass of the default policy (module docstring): starts, preemptions, reservations, estimates.

    Jobs with prerequisites left, and array tasks past their array's running limit, are held back
    before ranking (``gates``): they take no GPUs and no reservation, and are told why. A job waiting for
    prerequisites is then estimated by the pass's own placement, as ready once they end (``gates.estimates``):
    told it can never start where the pool could never place it, else when GPUs it can use are free then.
    """
    gate = gates.split(pending, running, now=now)
    ranking = priority.rank(
        now=now, pending=gate.ready, running=running, usage=usage, shares=shares, config=config
    )
    explainer = None
    if config.explain:
        explainer = explanation.FairshareExplainer(ranking=ranking, usage=usage, shares=shares, config=config)
    result, afterwards = placement.run(
        now=now,
        nodes=nodes,
        running=running,
        order=ranking.order,
        config=config,
        starved=ranking.starved,
        explainer=explainer,
        memo=memo,
    )
    result = widening.widen(result, pending=pending, nodes=nodes)
    if not config.explain:
        return result
    held = gates.estimates(
        now=now, gate=gate, running=running, planned=result.estimates, place=afterwards.estimate
    )
    return Plan(
        starts=result.starts,
        preemptions=result.preemptions,
        reservations=result.reservations,
        estimates={**result.estimates, **held},
        priority=ranking.components(),
    )


def easy_nodes(
    *,
    now: float,
    nodes: Sequence[NodeView],
    running: Sequence[RunningView],
    pending: Sequence[PendingJob],
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    config: PolicyConfig = DEFAULT_CONFIG,
    memo: ReleaseMemo | None = None,
) -> Plan:
    """EASY on this policy's engine: submit order, one reservation, node-aware placement.

    The fair comparison for the default policy on a pool of multi-GPU nodes (same placement
    rules); ``baselines.easy`` is the textbook flat-pool reference it is checked against.
    """
    return placement.schedule(
        now=now,
        nodes=nodes,
        running=running,
        order=by_submit(pending),
        config=PolicyConfig(reserve_top=1, max_reservations=1, explain=config.explain),
        memo=memo,
    )
