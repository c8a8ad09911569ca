"""Priority: fair share follows decayed usage against shares; age and the starvation bound."""

import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.scheduling.policy import plan
from jobs.scheduling.priority import fairshare_factors, rank, remember_terms, starvation_bound
from jobs.scheduling.types import NodeView, PendingJob, PendingList, PolicyConfig, RunningView

NOW = 5_000_000.0
DAY = 86400.0


def test_fair_share_factor_falls_as_usage_rises_against_equal_shares():
    f = fairshare_factors(teams=["a", "b", "c"], usage={"a": 0.0, "b": 100.0, "c": 900.0}, shares={})
    assert f["a"] == 1.0 > f["b"] > f["c"] > 0.0


def test_a_bigger_share_buys_priority_at_equal_usage():
    f = fairshare_factors(teams=["a", "b"], usage={"a": 500.0, "b": 500.0}, shares={"a": 3.0})
    assert f["a"] > f["b"]
    assert f["b"] == pytest.approx(0.5 ** (0.5 / 0.25))


def _queue(teams):
    return [
        PendingJob(job_id=i, team=t, gpus=1, hours=1.0, submitted_at=NOW - 600) for i, t in enumerate(teams)
    ]


def test_fair_share_orders_teams_as_their_decayed_usage_says():
    # Usage as the caller decays it: "old" used more GPU-hours, but long ago (four 7-day half-lives).
    usage = {
        "old": 9000 * 3600 / 2**4,
        "recent": 1000 * 3600,
        "idle": 0.0,
    }
    result = plan(
        now=NOW,
        nodes=[NodeView("n", 8, ())],
        running=[],
        pending=_queue(["recent", "old", "idle"]),
        usage=usage,
        shares={},
    )
    by_total = sorted(result.priority, key=lambda j: -result.priority[j]["total"])
    assert by_total == [2, 1, 0]  # idle, then old (decayed to 562 GPU-h), then recent


def test_the_team_with_the_least_usage_gets_the_one_free_gpu():
    result = plan(
        now=NOW,
        nodes=[NodeView("n", 8, (3,))],
        running=[],
        pending=_queue(["heavy", "light"]),
        usage={"heavy": 3.6e6, "light": 3.6e4},
        shares={},
    )
    assert [s.job_id for s in result.starts] == [1]
    reason = result.estimates[0].reason
    assert result.estimates[0].reason_code in {"reserved", "fairshare"}
    assert "1 GPU" in reason


def test_a_job_past_the_starvation_bound_goes_first_whatever_its_fair_share():
    pending = [
        PendingJob(1, "heavy", 8, 10.0, NOW - 2 * DAY),
        PendingJob(2, "light", 1, 0.1, NOW - 60),
    ]
    result = plan(
        now=NOW,
        nodes=[NodeView("n", 8, tuple(range(8)))],
        running=[],
        pending=pending,
        usage={"heavy": 1e9, "light": 0.0},
        shares={},
        config=PolicyConfig(starvation_s=DAY, starvation_factor=0.0, age_weight=0.0),
    )
    assert [s.job_id for s in result.starts] == [1]
    assert result.priority[1]["starved"] == 1.0


def test_priority_reports_its_components():
    result = plan(
        now=NOW, nodes=[NodeView("n", 8, ())], running=[], pending=_queue(["a"]), usage={}, shares={}
    )
    parts = result.priority[0]
    assert parts["total"] == pytest.approx(
        parts["fairshare"] + parts["age"] + parts["size"] + parts["slowdown"]
    )


def test_the_starvation_bound_is_relative_to_the_queues_mean_wait():
    config = PolicyConfig(starvation_s=6 * 3600.0, starvation_factor=4.0)
    calm = [PendingJob(i, "t", 1, 1.0, NOW - 600) for i in range(3)]
    assert starvation_bound(calm, now=NOW, config=config) == 6 * 3600.0  # the floor
    flooded = [PendingJob(i, "t", 1, 1.0, NOW - 3 * DAY) for i in range(3)]
    assert starvation_bound(flooded, now=NOW, config=config) == pytest.approx(7 * DAY)  # the ceiling
    two_hours = [PendingJob(i, "t", 1, 1.0, NOW - 7200) for i in range(3)]
    assert starvation_bound(two_hours, now=NOW, config=config) == pytest.approx(8 * 3600.0)
    fixed = PolicyConfig(starvation_s=DAY, starvation_factor=0.0)
    assert starvation_bound(flooded, now=NOW, config=fixed) == DAY


def test_an_overloaded_queue_keeps_short_jobs_first_instead_of_oldest_first():
    # Every job has waited days: a fixed 2-day bound would rank them oldest first.
    pending = [PendingJob(1, "t", 8, 24.0, NOW - 4 * DAY), PendingJob(2, "t", 8, 0.5, NOW - 3 * DAY)]
    result = plan(
        now=NOW, nodes=[NodeView("n", 8, tuple(range(8)))], running=[], pending=pending, usage={}, shares={}
    )
    assert [s.job_id for s in result.starts] == [2]


TWO_CONFIGS = (
    PolicyConfig(),
    PolicyConfig(
        age_weight=1.25, length_weight=0.1, slowdown_weight=0.02, starvation_factor=0.0, starvation_s=DAY
    ),
)


@st.composite
def queues(draw):
    """Queued jobs in submit order: a few teams, lengths around the 15-minute floor and far past it."""
    count = draw(st.integers(1, 30))
    submitted = sorted(draw(st.lists(st.floats(NOW - 5 * DAY, NOW), min_size=count, max_size=count)))
    hours = st.one_of(st.sampled_from([0.1, 0.25, 1.0, 24.0]), st.floats(0.01, 200.0))
    return [
        PendingJob(i, draw(st.sampled_from("abc")), draw(st.integers(1, 16)), draw(hours), submitted[i])
        for i in range(count)
    ]


def _reference_priority(job, *, usage, config):
    """The policy's priority written out from its docstring, term by term, for one job."""
    teams = sorted({"a", "b", "c"})
    total_used = sum(usage.get(t, 0.0) for t in teams)
    fairshare = (
        1.0 if not total_used else 2.0 ** -((usage.get(job.team, 0.0) / total_used) / (1 / len(teams)))
    )
    waited_s = NOW - job.submitted_at
    return (
        config.fairshare_weight * fairshare
        + config.age_weight * waited_s / DAY
        + config.length_weight / (1 + math.log2(1 + job.hours))
        + config.slowdown_weight * (waited_s / 3600) / max(job.hours, 0.25)
    )


@settings(max_examples=150, deadline=None)
@given(queues(), st.sampled_from([0, 1]))
def test_ranking_follows_the_written_priority_whichever_config_ranked_the_same_jobs_before(jobs, first):
    """Jobs whose priority terms were remembered for other weights rank as fresh jobs do (the terms of
    another config are not used); jobs remembered for these weights, in a keeper's submit-ordered list,
    rank the same; and the order falls in the priority the docstring writes out (starved jobs first,
    oldest first)."""
    usage = {"a": 4e6, "b": 1e5, "c": 0.0}
    config = TWO_CONFIGS[1 - first]
    everyone = ["a", "b", "c"]
    running = [RunningView(10_000 + i, t, {"n": (0,)}, NOW - 60, NOW + 60) for i, t in enumerate(everyone)]

    def ranked(pending, cfg):
        return rank(now=NOW, pending=pending, running=running, usage=usage, shares={}, config=cfg)

    for job in jobs:  # as a keeper does as it queues them (the replay), for the other config
        remember_terms(job, TWO_CONFIGS[first])
    ranked(jobs, TWO_CONFIGS[first])
    for job in jobs:
        assert job.rank_terms[0] is TWO_CONFIGS[first]  # ranked with the terms remembered on the jobs
    kept_jobs = [dataclasses.replace(j) for j in jobs]
    for job in kept_jobs:
        remember_terms(job, config)
    again = ranked(jobs, config)
    fresh = ranked([dataclasses.replace(j) for j in jobs], config)
    keeper = PendingList(kept_jobs)  # remembered for this config: the keys come from the terms on the jobs
    keeper.by_submit = True
    kept = ranked(keeper, config)
    ids = [j.job_id for j in again.order]
    assert ids == [j.job_id for j in fresh.order] == [j.job_id for j in kept.order]
    assert again.starved == fresh.starved == kept.starved
    starved = [j for j in again.order if j.job_id in again.starved]
    assert starved == again.order[: len(starved)]
    assert [j.submitted_at for j in starved] == sorted(j.submitted_at for j in starved)
    rest = [_reference_priority(j, usage=usage, config=config) for j in again.order[len(starved) :]]
    assert all(a >= b - 1e-9 * max(1.0, abs(a)) for a, b in itertools.pairwise(rest))
