"""What a job held back by a gate is told: one waiting for prerequisites is estimated by the pass's own
placement from when they end (and its staging after that), one the pool can never place is told so, and an
array task held by its array's limit is not promised its slot before its data arrives."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from jobs import scheduler
from jobs.models import DataInput, Dependency
from jobs.scheduling.policy import plan
from jobs.scheduling.types import NodeView, PendingJob, RunningView
from tests.factories import JobFactory

NOW = datetime(2026, 5, 4, 12, 0, tzinfo=UTC).timestamp()
HOUR = 3600.0


def _plan(pending, running=(), nodes=()):
    return plan(now=NOW, nodes=list(nodes), running=list(running), pending=pending, usage={}, shares={})


def _at(ts: float | None) -> str:
    return "no start" if ts is None else f"{datetime.fromtimestamp(ts, UTC):%H:%M}"


def test_a_dependent_job_too_large_for_the_pool_is_told_it_can_never_start():
    """A 64-GPU job on an 8-GPU pool can never start, prerequisite or not: no start time, and the reason says so."""
    nodes = [NodeView("gpu-01", 8, tuple(range(1, 8)))]
    running = [RunningView(812, "vision", {"gpu-01": (0,)}, NOW - HOUR, NOW + HOUR)]
    pending = [PendingJob(900, "vision", 64, 1.0, NOW - 60, waits_for=((812, "succeed"),))]
    e = _plan(pending, running, nodes).estimates[900]
    assert e.start_at is None, f"told it starts at {_at(e.start_at)}: {e.reason}"
    assert e.reason_code == "too_large"
    assert e.reason.startswith("larger than the pool can ever place: needs 64 GPUs")
    assert e.reason.endswith("; it also waits for job 812 to succeed")


def test_a_dependent_job_on_a_drained_pool_gets_no_start_until_an_operator_resumes_it():
    nodes = [NodeView("gpu-01", 8, tuple(range(1, 8)), schedulable=False)]
    running = [RunningView(812, "vision", {"gpu-01": (0,)}, NOW - HOUR, NOW + HOUR)]
    pending = [PendingJob(900, "vision", 2, 1.0, NOW - 60, waits_for=((812, "succeed"),))]
    e = _plan(pending, running, nodes).estimates[900]
    assert e.start_at is None and e.reason_code == "no_nodes", e.reason
    assert "waits for job 812 to succeed" in e.reason


def test_a_dependent_job_is_not_promised_gpus_that_stay_busy_after_its_prerequisite_ends():
    """Job 900 needs all 8 GPUs of the only node; its 1-GPU prerequisite ends at 13:00, but another job holds
    the other 7 GPUs until 22:00: it cannot start before 22:00."""
    nodes = [NodeView("gpu-01", 8, ())]
    running = [
        RunningView(812, "vision", {"gpu-01": (0,)}, NOW - HOUR, NOW + HOUR),
        RunningView(813, "audio", {"gpu-01": (1, 2, 3, 4, 5, 6, 7)}, NOW - HOUR, NOW + 10 * HOUR),
    ]
    pending = [PendingJob(900, "vision", 8, 1.0, NOW - 60, waits_for=((812, "succeed"),))]
    result = _plan(pending, running, nodes)
    e = result.estimates[900]
    assert e.start_at == NOW + 10 * HOUR, f"told {_at(e.start_at)}: {e.reason}"
    assert e.reason_code == "dependency"
    assert e.reason == (
        "waiting for job 812 to succeed (expected to end by 13:00 UTC); "
        "the GPUs it needs are busy until about 22:00 UTC"
    )
    assert result.starts == [] and result.reservations == []  # held back: it takes no GPU and no reservation


def test_a_dependent_job_stages_only_once_its_prerequisite_ends():
    """Its data takes 30 minutes to stage, and staging begins only once job 812 ends at 13:00."""
    nodes = [NodeView("gpu-01", 8, tuple(range(1, 8)))]
    running = [RunningView(812, "vision", {"gpu-01": (0,)}, NOW - HOUR, NOW + HOUR)]
    pending = [PendingJob(900, "vision", 1, 1.0, NOW - 60, waits_for=((812, "succeed"),), stage_s=1800)]
    e = _plan(pending, running, nodes).estimates[900]
    assert e.start_at == NOW + 1.5 * HOUR, _at(e.start_at)
    assert e.reason == (
        "waiting for job 812 to succeed (expected to end by 13:00 UTC); "
        "its data is staged only then (ready about 13:30 UTC)"
    )


def test_a_chain_follows_the_busy_gpus_of_its_middle_step():
    """Train (8 GPUs) waits for preprocess and for GPUs busy until 22:00; evaluate waits for train: it is told
    train's end from train's own estimate (22:00 + 2 h), not from preprocess's end."""
    nodes = [NodeView("gpu-01", 8, ())]
    running = [
        RunningView(1, "vision", {"gpu-01": (0,)}, NOW - HOUR, NOW + HOUR),  # preprocess
        RunningView(813, "audio", {"gpu-01": (1, 2, 3, 4, 5, 6, 7)}, NOW - HOUR, NOW + 10 * HOUR),
    ]
    pending = [
        PendingJob(2, "vision", 8, 2.0, NOW, waits_for=((1, "succeed"),)),  # train
        PendingJob(3, "vision", 1, 1.0, NOW, waits_for=((2, "succeed"),)),  # evaluate
    ]
    result = _plan(pending, running, nodes)
    assert result.estimates[2].start_at == NOW + 10 * HOUR
    assert result.estimates[3].start_at == NOW + 12 * HOUR
    assert (
        result.estimates[3].reason == "waiting for job 2 to succeed (expected to end by 00:00 UTC on 5 May)"
    )


def test_a_job_whose_prerequisite_can_never_start_gets_no_start_either():
    pending = [
        PendingJob(1, "vision", 64, 1.0, NOW),
        PendingJob(2, "vision", 1, 1.0, NOW, waits_for=((1, "succeed"),)),
    ]
    e = _plan(pending, nodes=[NodeView("gpu-01", 8, tuple(range(8)))]).estimates[2]
    assert e.start_at is None and e.reason_code == "dependency"
    assert e.reason == "waiting for job 1 to succeed (it cannot be placed on this pool as it is)"


@given(
    free=st.integers(0, 8),
    busy_hours=st.integers(1, 12),
    waiting=st.lists(st.tuples(st.integers(1, 16), st.integers(1, 4)), max_size=4),
)
def test_jobs_waiting_for_prerequisites_change_no_decision_of_the_pass(free, busy_hours, waiting):
    nodes = [NodeView("gpu-01", 8, tuple(range(8 - free, 8))), NodeView("gpu-02", 4, (0, 1, 2, 3))]
    running = [
        RunningView(812, "vision", {"gpu-01": tuple(range(8 - free))}, NOW - HOUR, NOW + busy_hours * HOUR)
    ]
    ready = [PendingJob(100, "vision", 4, 2.0, NOW - 60), PendingJob(101, "audio", 8, 1.0, NOW - 30)]
    held = [
        PendingJob(200 + i, "vision", gpus, float(hours), NOW - 90, waits_for=((812, "end"),))
        for i, (gpus, hours) in enumerate(waiting)
    ]
    alone, with_held = _plan(ready, running, nodes), _plan(ready + held, running, nodes)
    assert (with_held.starts, with_held.reservations) == (alone.starts, alone.reservations)
    for job in held:
        e = with_held.estimates[job.job_id]
        if job.gpus > 12:
            assert e.start_at is None
        else:
            assert e.start_at is not None and e.start_at >= NOW + busy_hours * HOUR, e.reason


def test_a_throttled_array_task_still_staging_is_not_promised_a_start_before_its_data_arrives():
    """Array 7 runs at most 1 task; its running task ends at 12:10, but task 901's data arrives only at 14:00."""
    nodes = [NodeView("gpu-01", 4, (1, 2, 3))]
    running = [RunningView(900, "vision", {"gpu-01": (0,)}, NOW - HOUR, NOW + 600, array=7)]
    ready = NOW + 2 * HOUR
    pending = [PendingJob(901, "vision", 1, 1.0, NOW - 60, ready_at=ready, array=7, array_limit=1)]
    e = _plan(pending, running, nodes).estimates[901]
    assert e.start_at == ready, f"told {_at(e.start_at)}, data ETA 14:00: {e.reason}"
    assert e.reason_code == "array_limit"
    assert (
        e.reason
        == "array 7 runs at most 1 task at once: 1 is running; its data is still staging (ETA 14:00 UTC)"
    )


def test_a_throttled_task_whose_data_arrives_before_its_slot_is_told_the_slot():
    nodes = [NodeView("gpu-01", 4, (1, 2, 3))]
    running = [RunningView(900, "vision", {"gpu-01": (0,)}, NOW - HOUR, NOW + HOUR, array=7)]
    pending = [PendingJob(901, "vision", 1, 1.0, NOW - 60, ready_at=NOW + 600, array=7, array_limit=1)]
    e = _plan(pending, running, nodes).estimates[901]
    assert e.start_at == NOW + HOUR
    assert e.reason == "array 7 runs at most 1 task at once: 1 is running"


@pytest.mark.django_db
def test_the_live_pass_tells_a_dependent_job_its_staging_begins_after_its_prerequisite(team, pool, settings):
    """A 1-hour prerequisite rents now; the dependent job's 1.8 GB at 1 MB/s take 30 minutes to stage, once it
    has ended: it is told about 1 h 30 min from now, and why."""
    settings.E31_ASSUMED_STAGE_RATE = 1e6
    now = timezone.now()
    pre = JobFactory(team=team, gpus=1, hours=1.0, submitted_at=now - timedelta(minutes=5))
    job = JobFactory(team=team, state="submitted", gpus=1, submitted_at=now - timedelta(minutes=4))
    Dependency.objects.create(job=job, prerequisite=pre, kind=Dependency.AFTER_OK)
    DataInput.objects.create(
        job=job, position=0, name="features", uri="file:///data/features.bin", bytes=1_800_000_000
    )
    scheduler.run_pass(now=now)
    pre.refresh_from_db(), job.refresh_from_db()
    assert pre.state == "rented" and job.state == "submitted"
    assert job.estimated_start is not None
    assert abs((job.estimated_start - now).total_seconds() - 1.5 * HOUR) < 120, job.estimated_start - now
    assert job.pending_reason.startswith(f"waiting for job {pre.id} to succeed (expected to end by ")
    assert "its data is staged only then" in job.pending_reason


def test_a_long_chain_of_dependent_jobs_is_placed_a_bounded_number_of_times_and_told_so(monkeypatch):
    """Found by trying it: each level of a chain was estimated by a placement of its own, each rebuilding the pass's
    timeline, so one team's 2,000 jobs, each naming the one before (within its waiting cap, parked behind a job that
    never starts), made every pass take 4.6 to 7.6 s under the pool-wide lock instead of 68 ms. Past PLACED_LEVELS
    levels a job is estimated from its prerequisites alone, and says so."""
    from jobs.scheduling import gates

    placements = []
    place = gates._Waits.estimates

    def counting(self, place_level):
        def counted(jobs):
            placements.append(len(jobs))
            return place_level(jobs)

        return place(self, counted)

    monkeypatch.setattr(gates._Waits, "estimates", counting)
    nodes = [NodeView("gpu-01", 8, tuple(range(1, 8)))]
    running = [RunningView(812, "vision", {"gpu-01": (0,)}, NOW - HOUR, NOW + HOUR)]
    chain = [PendingJob(1000 + i, "vision", 1, 1.0, NOW - 60, waits_for=((999 + i if i else 812, "succeed"),))
             for i in range(300)]  # fmt: skip
    estimates = _plan(chain, running, nodes).estimates
    assert len(placements) == gates.PLACED_LEVELS
    first, deep = estimates[1000], estimates[1299]
    assert first.start_at == NOW + HOUR and "prerequisites alone" not in first.reason
    assert deep.start_at == NOW + 300 * HOUR and deep.reason.endswith(gates.DEEP), deep.reason
