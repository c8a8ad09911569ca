"""Priority of queued jobs: fair share over decayed usage, age, declared length, starvation bound.

Pure core (standard library only, ``now`` passed in). How the terms combine is told in
``jobs.scheduling.policy``'s docstring.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import compress, count, repeat
from operator import add, attrgetter, lt

from jobs.scheduling.types import (
    DAY_S,
    HOUR_S,
    PendingJob,
    PendingList,
    PolicyConfig,
    RunningView,
    ranked_hours,
    teams_present,
)


def fairshare_factors(
    *, teams: Iterable[str], usage: Mapping[str, float], shares: Mapping[str, float]
) -> dict[str, float]:
    """F per team in (0, 1]: 1 with no usage, 0.5 when usage fraction equals share fraction.

    Both fractions are over ``teams`` (those present); a missing share counts as 1.0.
    """
    teams = list(teams)
    share = {t: max(float(shares.get(t, 1.0)), 1e-9) for t in teams}
    used = {t: max(float(usage.get(t, 0.0)), 0.0) for t in teams}
    # fsum: exact, so the factors do not depend on the order the teams come in (a set's, hash-seeded).
    total_share, total_used = math.fsum(share.values()), math.fsum(used.values())
    if total_used <= 0.0:
        return dict.fromkeys(teams, 1.0)
    return {t: 2.0 ** -((used[t] / total_used) / (share[t] / total_share)) for t in teams}


def length_factor(hours: float) -> float:
    """S in (0, 1]: 1 for an instant job, 0.5 for one declared hour, falling slowly (log) after."""
    return 1.0 / (1.0 + math.log2(1.0 + max(hours, 0.0)))


@dataclass(frozen=True, slots=True)
class Ranking:
    order: list[PendingJob]
    starved: frozenset[int]
    fairshare: dict[str, float]
    components: Callable[[], dict[int, dict[str, float]]]


def rank(
    *,
    now: float,
    pending: Sequence[PendingJob],
    running: Sequence[RunningView],
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    config: PolicyConfig,
) -> Ranking:
    """Priority order: starved jobs first (oldest first), then by total priority (ties: caller order).

    Age is linear and shared by all, so the order only needs age_w * submitted/day - fs_w * F(team)
    - length_w * S: one float per job (this runs every pass over the whole queue), sorted in C.
    """
    fs = fairshare_factors(teams=teams_present(pending, running), usage=usage, shares=shares)
    fs_term = {t: config.fairshare_weight * f for t, f in fs.items()}
    keys = _keys(pending, fs_term=fs_term, now=now, config=config)
    ranked = sorted(range(len(pending)), key=keys.__getitem__)
    order = list(map(pending.__getitem__, ranked))
    starved = 0  # starved jobs are a prefix of the order
    while starved < len(ranked) and keys[ranked[starved]] < -1e29:
        starved += 1
    starved_ids = frozenset(map(_job_id, order[:starved]))

    def components() -> dict[int, dict[str, float]]:
        return {
            j.job_id: _components(j, now=now, fs=fs[j.team], config=config, starved=j.job_id in starved_ids)
            for j in order
        }

    return Ranking(order=order, starved=starved_ids, fairshare=fs, components=components)


# Estimates shorter than this count as this long in the slowdown term (bounded slowdown's floor,
# scaled to declared limits): a 1-minute declaration must not outrank everything after a minute.
MIN_ESTIMATE_H = 0.25


def starvation_bound(pending: Sequence[PendingJob], *, now: float, config: PolicyConfig) -> float:
    """Seconds of waiting after which a job is starved: ``starvation_s``, or, when
    ``starvation_factor`` is set, that many times the mean wait of the queue (at least
    ``starvation_s``, at most ``starvation_max_s``) - so an overloaded queue, where every wait is
    long, keeps its order, and a queue that only grows still cannot hold a job back for ever."""
    return _starvation_bound(list(map(_submitted, pending)), now=now, config=config)


def _starvation_bound(submitted: Sequence[float], *, now: float, config: PolicyConfig) -> float:
    if not config.starvation_factor or not submitted:
        return config.starvation_s
    mean_wait = now - sum(submitted) / len(submitted)
    return min(max(config.starvation_s, config.starvation_factor * mean_wait), config.starvation_max_s)


def _keys(
    pending: Sequence[PendingJob], *, fs_term: Mapping[str, float], now: float, config: PolicyConfig
) -> list[float]:
    """Sort keys (lower first): -1e30 + submitted for starved jobs, else -(priority) + a constant.

    Per job the key is linear in ``now``: ``A - (L + now * slow) - fs[team]``, with the age, length
    and expected-slowdown terms folded into A, L and slow, which do not change while the job waits:
    a keeper whose jobs stay the same objects (the replay) has them worked out once per job
    (``remember_terms``); for new ones (a live pass) they are worked out here, the same arithmetic.
    Each is one comprehension (Python 3.11 specialises its float arithmetic and slot reads: several
    times faster here than chains of C-level maps) - this runs every pass over the whole queue.
    """
    if not pending:
        return []
    keys = [
        a - (length + now * slow) - fs_term[team]
        for for_config, a, length, slow, team in map(_rank_terms, pending)
        if for_config is config
    ]
    if len(keys) < len(pending):  # not all remembered for these weights: the same terms, worked out now
        per_est = config.slowdown_weight / HOUR_S
        age_per_s, length_w, floor = config.age_weight / DAY_S, config.length_weight, MIN_ESTIMATE_H
        keys = [
            # max(h, floor) written out; wait / estimate is (now - submitted) * slow. h is ``ranked_hours``
            # written out: the declared limit (never 0) where ``hours`` is a learned prediction
            job.submitted_at
            * (age_per_s + (slow := per_est / (h if (h := job.limit_hours or job.hours) > floor else floor)))
            - (length_w * _cached_length_factor(h) + now * slow)
            - fs_term[job.team]
            for job in pending
        ]
    submitted = list(map(_submitted, pending))
    starve_before = now - _starvation_bound(submitted, now=now, config=config)
    if min(submitted) < starve_before:
        _starve(
            keys,
            submitted,
            starve_before,
            in_submit_order=isinstance(pending, PendingList) and pending.by_submit,
        )
    return keys


def remember_terms(job: PendingJob, config: PolicyConfig) -> None:
    """Work out ``job``'s priority terms for ``config`` once and keep them on the job (see ``_keys``):
    for a keeper whose queued jobs stay the same objects while they wait, as it queues each."""
    hours = ranked_hours(job)
    slow = config.slowdown_weight / HOUR_S / max(hours, MIN_ESTIMATE_H)
    a = job.submitted_at * (config.age_weight / DAY_S + slow)
    length = config.length_weight * _cached_length_factor(hours)
    object.__setattr__(job, "rank_terms", (config, a, length, slow, job.team))  # a memo on a frozen job


def _starve(keys: list[float], submitted: list[float], before: float, *, in_submit_order: bool) -> None:
    """Starved jobs (submitted before ``before``) go before everyone else, oldest first: their key
    becomes -1e30 + submitted. In submit order they are a prefix, replaced at once."""
    if in_submit_order:
        n = bisect_left(submitted, before)
        keys[:n] = map(add, repeat(-1e30), submitted[:n])
        return
    for i in compress(count(), map(lt, submitted, repeat(before))):
        keys[i] = -1e30 + submitted[i]


# length_factor by declared hours, across passes; lru_cache, not a dict of our own: passes run on several
# worker threads at once, and its lookups and evictions are safe among them.
_cached_length_factor = lru_cache(maxsize=100_000)(length_factor)


_team = attrgetter("team")
_job_id = attrgetter("job_id")
_submitted = attrgetter("submitted_at")
_rank_terms = attrgetter("rank_terms")


def _components(
    job: PendingJob, *, now: float, fs: float, config: PolicyConfig, starved: bool
) -> dict[str, float]:
    """The priority breakdown shown to operators: "size" is the job-shape term (length_weight x S,
    from declared hours), named as the operator queue page reads it."""
    fairshare = config.fairshare_weight * fs
    age = config.age_weight * max(now - job.submitted_at, 0.0) / DAY_S
    size = config.length_weight * length_factor(ranked_hours(job))
    wait = max(now - job.submitted_at, 0.0)
    slowdown = config.slowdown_weight * wait / HOUR_S / max(ranked_hours(job), MIN_ESTIMATE_H)
    return {
        "fairshare": fairshare,
        "age": age,
        "size": size,
        "slowdown": slowdown,
        "total": fairshare + age + size + slowdown,
        "starved": 1.0 if starved else 0.0,
    }
