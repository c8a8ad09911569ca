"""A team cannot fake its learned run times to jump the queue or to backfill a long job before another team's
reservation: ranking reads the declared hours (learned run times are for backfill and the estimated start
only), and only runs that tell a run time (succeeded, or stopped at their limit) teach the prediction."""

import math
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import scheduler, selectors, snapshot
from jobs.lifecycle import RAN_TO_ITS_END
from jobs.models import Allocation, GpuHold, TeamUsage
from jobs.scheduling import policy, prediction, types
from jobs.scheduling.prediction import Finished
from tests.factories import JobFactory, NodeFactory

NOW = 1_780_000_000.0
HOUR = 3600.0
# Team A has used 10,000 times what team B has. B runs 4 GPUs of an 8-GPU node for one more hour and waits
# for the whole node (24 h, submitted 2 h ago); A has just submitted a 4-GPU job declared 168 h.
NODE = types.NodeView(name="n1", gpus=8, free=(4, 5, 6, 7))
B_RUNNING = types.RunningView(
    job_id=1, team="B", gpus_by_node={"n1": (0, 1, 2, 3)}, started_at=NOW - HOUR, expected_end=NOW + HOUR
)
B = types.PendingJob(job_id=10, team="B", gpus=8, hours=24.0, submitted_at=NOW - 2 * HOUR)
A = types.PendingJob(job_id=20, team="A", gpus=4, hours=168.0, submitted_at=NOW)
USAGE = {"A": 1e7, "B": 1e3}
# Five `false` jobs declared 168 h, each failing within seconds.
THROWAWAY = [Finished(run_s=5.0, declared_hours=168.0, end_reason="failed")] * 5


def _plan(a: types.PendingJob):
    return policy.plan(now=NOW, nodes=[NODE], running=[B_RUNNING], pending=[B, a], usage=USAGE, shares={})


def test_throwaway_failures_neither_raise_a_teams_priority_nor_backfill_its_long_job_on_a_reservation():
    honest = _plan(prediction.planned(A, prediction.COLD))
    gamed_job = prediction.planned(A, prediction.learn(THROWAWAY))
    gamed = _plan(gamed_job)
    assert gamed_job.hours == 168.0
    assert gamed.priority[20]["total"] == honest.priority[20]["total"] < gamed.priority[10]["total"]
    assert [s.job_id for s in gamed.starts] == []
    (b_reserved,) = [r for r in gamed.reservations if r.job_id == 10]
    assert b_reserved.start_at - NOW == pytest.approx(
        HOUR
    )  # seconds: a timestamp's relative tolerance is ±28 min


def test_a_short_prediction_plans_backfill_but_never_raises_the_rank():
    """Runs that succeeded within seconds do teach (the remaining gap: the cost falls on backfill, bounded by
    the extension once the job outruns its prediction): the job is planned as a minute, ranked as declared."""
    quick = prediction.learn([Finished(run_s=5.0, declared_hours=168.0)] * 5)
    planned = prediction.planned(A, quick)
    assert planned.hours == pytest.approx(1 / 60) and planned.limit_hours == 168.0
    honest = _plan(prediction.planned(A, prediction.COLD))
    assert _plan(planned).priority[20] == honest.priority[20]
    assert _plan(planned).priority[20]["total"] < honest.priority[10]["total"]


def test_ranking_reads_the_declared_hours_and_backfill_the_prediction():
    half = prediction.planned(A, prediction.learn([Finished(run_s=84 * HOUR, declared_hours=168.0)] * 5))
    assert (half.hours, half.limit_hours) == (84.0, 168.0)
    assert (
        prediction.planned(half, prediction.COLD).limit_hours == 168.0
    )  # planned twice: still the declaration
    assert _plan(half).priority[20] == _plan(A).priority[20]


@pytest.mark.parametrize("reason", ["failed", "cancelled", "out_of_memory", "node_lost", "output_failed"])
def test_runs_that_do_not_tell_a_run_time_teach_nothing(reason):
    taught = [Finished(run_s=4 * HOUR, declared_hours=10.0)] * 6
    learned = prediction.learn([*taught, *[Finished(run_s=1.0, declared_hours=10.0, end_reason=reason)] * 20])
    assert learned.jobs == 6 and math.isclose(learned.ratio, 0.4)
    assert prediction.learn([Finished(run_s=1.0, declared_hours=10.0, end_reason=reason)] * 20).ratio is None


def test_the_runs_that_teach_are_read_from_the_index_of_jobs_that_ran_to_their_end():
    assert set(prediction.TEACHES) <= set(RAN_TO_ITS_END)


def test_a_run_stopped_at_its_limit_teaches_that_the_team_needs_all_of_it():
    learned = prediction.learn(
        [Finished(run_s=10 * HOUR + 30, declared_hours=10.0, end_reason="timed_out")] * 5
    )
    assert learned.ratio == 1.0


# The live scheduler: the selector, the snapshot and a pass.


def _released(team, *, node, end_reason, run_s, hours=168.0, count=5, ago_h=1.0):
    now = timezone.now()
    for i in range(count):
        started = now - timedelta(hours=ago_h) + timedelta(minutes=i)
        job = JobFactory(
            team=team, state="released", end_reason=end_reason, hours=hours, attempt=1,
            state_changed_at=started + timedelta(seconds=run_s + 1),
        )  # fmt: skip
        Allocation.objects.create(
            job=job, attempt=1, node=node, rank=0, gpu_indices=[0], rented_at=started, started_at=started,
            finished_at=started + timedelta(seconds=run_s), released_at=started + timedelta(seconds=run_s + 1),
            end_reason=end_reason,
        )  # fmt: skip


@pytest.mark.django_db
def test_failed_and_cancelled_jobs_do_not_enter_the_learned_ratio(team):
    node = NodeFactory(name="n1", gpus=8)
    _released(team, node=node, end_reason="succeeded", run_s=4 * HOUR, hours=10.0, count=6, ago_h=48)
    _released(team, node=node, end_reason="failed", run_s=5.0)
    _released(team, node=node, end_reason="cancelled", run_s=5.0)
    _released(team, node=node, end_reason="out_of_memory", run_s=5.0)
    learned = selectors.learned_run_times([team.name])[team.name]
    assert learned.jobs == 6 and math.isclose(learned.ratio, 0.4)


@pytest.mark.django_db
def test_a_team_of_only_throwaway_failures_is_planned_and_ranked_by_its_declaration(team, other_team):
    node = NodeFactory(name="n1", gpus=8)
    _released(team, node=node, end_reason="failed", run_s=5.0)
    assert selectors.learned_run_times([team.name])[team.name].ratio is None
    now = timezone.now()
    TeamUsage.objects.create(team=team, gpu_seconds=1e7, as_of=now)  # A has used far more than B
    b_run = JobFactory(team=other_team, state="running", hours=2.0, gpus=4, attempt=1)
    held = Allocation.objects.create(
        job=b_run, attempt=1, node=node, rank=0, gpu_indices=[0, 1, 2, 3], rented_at=now - timedelta(hours=1),
        started_at=now - timedelta(hours=1),
    )  # fmt: skip
    GpuHold.objects.bulk_create(GpuHold(allocation=held, node=node, gpu_index=i) for i in range(4))
    b = JobFactory(team=other_team, gpus=8, hours=24.0, submitted_at=now - timedelta(hours=2))
    a = JobFactory(team=team, gpus=4, hours=168.0, submitted_at=now)
    (planned,) = [p for p in snapshot.take(now=now).pending if p.job_id == a.id]
    assert (planned.hours, planned.limit_hours) == (168.0, 168.0)
    scheduler._pass(now=now)
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.state, b.state) == ("queued", "queued")
    assert b.priority > a.priority
    assert "reserved on n1" in b.pending_reason


@pytest.mark.django_db
def test_the_snapshot_plans_with_the_prediction_and_ranks_with_the_declaration(team):
    node = NodeFactory(name="n1", gpus=8)
    _released(team, node=node, end_reason="succeeded", run_s=4 * HOUR, hours=10.0, count=6, ago_h=48)
    queued = JobFactory(team=team, hours=5)
    (pending,) = [p for p in snapshot.take(now=timezone.now()).pending if p.job_id == queued.id]
    assert math.isclose(pending.hours, 2.0) and pending.limit_hours == 5


@pytest.mark.django_db
def test_the_submit_forms_estimate_plans_the_draft_as_the_pass_does(team, monkeypatch):
    """The form's estimated start ranked the draft by its prediction (a team whose jobs used 40 % of their hours
    saw its 10 h draft ranked as a 4 h one) while the pass ranks it by its declaration: the start it promised was
    one the pass would not give."""
    from jobs import estimates

    node = NodeFactory(name="n1", gpus=8)
    _released(team, node=node, end_reason="succeeded", run_s=4 * HOUR, hours=10.0, count=6, ago_h=48)
    draft = types.PendingJob(job_id=estimates.DRAFT_ID, team=team.name, gpus=1, hours=10.0, submitted_at=NOW)
    seen, plan = [], policy.plan
    monkeypatch.setattr(policy, "plan", lambda **kw: seen.append(kw["pending"][-1]) or plan(**kw))
    estimates.draft_options(draft=draft, team=team, now=timezone.now())
    learned = selectors.learned_run_times([team.name])[team.name]
    assert seen[0] == prediction.planned(draft, learned)
    assert (seen[0].hours, seen[0].limit_hours) == (pytest.approx(4.0), 10.0)
