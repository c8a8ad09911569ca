"""Jobs held back by facts outside the pool: prerequisites not yet ended, an array's running limit."""

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from jobs.scheduling.policy import plan
from jobs.scheduling.types import NodeView, PendingJob, RunningView

NOW = datetime(2026, 5, 4, 12, 0, tzinfo=UTC).timestamp()
HOUR = 3600.0


def _idle(nodes: int = 2, gpus: int = 4) -> list[NodeView]:
    return [NodeView(f"gpu-{i:02}", gpus, tuple(range(gpus))) for i in range(1, nodes + 1)]


def _plan(pending, running=(), nodes=None):
    return plan(now=NOW, nodes=nodes or _idle(), running=list(running), pending=pending, usage={}, shares={})


def test_a_job_waiting_for_a_running_prerequisite_stays_queued_on_an_idle_pool_until_it_ends():
    nodes = [NodeView("gpu-01", 4, (1, 2, 3)), NodeView("gpu-02", 4, (0, 1, 2, 3))]
    running = [RunningView(812, "vision", {"gpu-01": (0,)}, NOW - HOUR, NOW + 2 * HOUR)]
    result = _plan(
        [PendingJob(900, "vision", 1, 1.0, NOW - 60, waits_for=((812, "succeed"),))], running, nodes
    )
    assert result.starts == []
    e = result.estimates[900]
    assert e.reason_code == "dependency"
    assert e.reason == "waiting for job 812 to succeed (expected to end by 14:00 UTC)"
    assert e.start_at == NOW + 2 * HOUR


def test_after_any_waits_for_the_prerequisite_to_end_however_it_ends():
    result = _plan([PendingJob(900, "vision", 1, 1.0, NOW, waits_for=((812, "end"),))])
    assert result.starts == []
    assert result.estimates[900].reason.startswith("waiting for job 812 to end")


def test_a_chain_is_estimated_from_each_prerequisites_own_estimate_and_declared_hours():
    pending = [
        PendingJob(1, "vision", 4, 2.0, NOW),  # preprocess: starts now on the idle pool
        PendingJob(2, "vision", 4, 3.0, NOW, waits_for=((1, "succeed"),)),  # train
        PendingJob(3, "vision", 1, 1.0, NOW, waits_for=((2, "succeed"),)),  # evaluate
    ]
    result = _plan(pending)
    assert [s.job_id for s in result.starts] == [1]
    assert result.estimates[2].start_at == NOW + 2 * HOUR
    assert result.estimates[3].start_at == NOW + 5 * HOUR
    assert result.estimates[3].reason.startswith("waiting for job 2 to succeed")


def test_a_job_whose_prerequisites_all_ended_well_is_scheduled_like_any_other():
    result = _plan([PendingJob(900, "vision", 1, 1.0, NOW)])
    assert [s.job_id for s in result.starts] == [900]


def _tasks(array: int, count: int, limit: int, first_id: int = 1) -> list[PendingJob]:
    return [
        PendingJob(first_id + i, "vision", 1, 1.0, NOW - 60, array=array, array_limit=limit)
        for i in range(count)
    ]


def test_an_array_never_runs_more_tasks_than_its_limit_even_on_an_idle_pool():
    result = _plan(_tasks(array=7, count=6, limit=2))
    assert [s.job_id for s in result.starts] == [1, 2]
    held = result.estimates[3]
    assert held.reason_code == "array_limit"
    assert held.reason.startswith("array 7 runs at most 2 tasks at once")


def test_running_tasks_count_against_the_limit_and_the_next_wave_starts_as_they_end():
    running = [
        RunningView(100, "vision", {"gpu-01": (0,)}, NOW - HOUR, NOW + HOUR, array=7),
        RunningView(101, "vision", {"gpu-01": (1,)}, NOW - HOUR, NOW + 2 * HOUR, array=7),
    ]
    nodes = [NodeView("gpu-01", 4, (2, 3)), NodeView("gpu-02", 4, (0, 1, 2, 3))]
    result = _plan(_tasks(array=7, count=4, limit=3), running, nodes)
    assert [s.job_id for s in result.starts] == [1]
    # three slots: task 100 ends at +1 h, task 1 (starting now, 1 h) at +1 h, task 101 at +2 h
    assert [result.estimates[j].start_at for j in (2, 3, 4)] == [NOW + HOUR, NOW + HOUR, NOW + 2 * HOUR]
    assert result.estimates[2].reason == "array 7 runs at most 3 tasks at once: 3 are running"


def test_a_task_still_staging_does_not_hold_its_arrays_only_slot_against_a_ready_sibling():
    """Task 1 is staging for two more hours (no GPU held); task 2 is queued, its data in place: on an idle
    pool, the array's one slot goes to task 2, and task 1 is told a task is running (and when its data comes)."""
    staging = PendingJob(1, "vision", 1, 1.0, NOW - 60, array=40, array_limit=1, ready_at=NOW + 2 * HOUR)
    ready = PendingJob(2, "vision", 1, 1.0, NOW - 60, array=40, array_limit=1)
    result = _plan([staging, ready], nodes=[NodeView("gpu-01", 4, (0, 1, 2, 3))])
    assert [s.job_id for s in result.starts] == [2], result.estimates[2].reason
    assert result.estimates[1].reason == (
        "array 40 runs at most 1 task at once: 1 is running; its data is still staging (ETA 14:00 UTC)"
    )
    assert result.estimates[1].start_at == NOW + 2 * HOUR  # its slot frees at 13:00, its data at 14:00


def test_a_task_still_staging_keeps_a_slot_no_ready_sibling_needs():
    """Limit 2, one task ready, two staging: the ready one starts, the lower staging one keeps the second
    slot (planned from its staging ETA), and the last waits for a slot, next in line behind it."""
    pending = [
        PendingJob(1, "vision", 1, 1.0, NOW - 60, array=40, array_limit=2, ready_at=NOW + HOUR),
        PendingJob(2, "vision", 1, 1.0, NOW - 60, array=40, array_limit=2, ready_at=NOW + HOUR),
        PendingJob(3, "vision", 1, 1.0, NOW - 60, array=40, array_limit=2),
    ]
    result = _plan(pending)
    assert [s.job_id for s in result.starts] == [3]
    assert result.estimates[1].reason_code != "array_limit" and result.estimates[1].start_at == NOW + HOUR
    assert result.estimates[2].reason == "array 40 runs at most 2 tasks at once: 1 running, 1 next in line"


def test_another_arrays_tasks_and_other_jobs_are_not_held_by_a_full_array():
    pending = [*_tasks(array=7, count=3, limit=1), PendingJob(50, "vision", 1, 1.0, NOW)]
    pending += _tasks(array=8, count=2, limit=1, first_id=60)
    result = _plan(pending)
    assert sorted(s.job_id for s in result.starts) == [1, 50, 60]


@given(
    limit=st.integers(1, 6),
    running=st.integers(0, 6),
    queued=st.integers(0, 12),
    free=st.integers(0, 8),
)
def test_starts_never_take_an_array_past_its_limit(limit, running, queued, free):
    runs = [
        RunningView(1000 + i, "vision", {"busy": (i,)}, NOW - HOUR, NOW + HOUR, array=7)
        for i in range(running)
    ]
    nodes = [NodeView("busy", max(running, 1), ()), NodeView("idle", 8, tuple(range(free)))]
    result = _plan(_tasks(array=7, count=queued, limit=limit), runs, nodes)
    assert len(result.starts) <= max(limit - running, 0)
    assert set(result.estimates) == set(range(1, queued + 1))
