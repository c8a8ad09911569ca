"""An elastic job with max_gpus starts wider on GPUs that would otherwise idle, never on GPUs a waiting job needs."""

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.scheduling import simulate
from jobs.scheduling.policy import plan
from jobs.scheduling.traces import TraceJob
from jobs.scheduling.types import NodeView, PendingJob, RunningView

NOW = 1_000_000.0


def _plan(nodes, pending, running=()):
    return plan(now=NOW, nodes=nodes, running=list(running), pending=pending, usage={}, shares={})


def _held(result, job_id):
    (start,) = [s for s in result.starts if s.job_id == job_id]
    return sum(len(ix) for ix in start.gpus_by_node.values())


def test_an_elastic_job_starts_wider_on_idle_gpus_when_nothing_else_waits():
    result = _plan([NodeView("n1", 8, tuple(range(8)))], [PendingJob(1, "t", 2, 1.0, NOW, max_gpus=6)])
    assert _held(result, 1) == 6


def test_a_wider_start_never_takes_more_than_the_node_has_free():
    result = _plan([NodeView("n1", 8, (0, 1, 2))], [PendingJob(1, "t", 2, 1.0, NOW, max_gpus=8)])
    assert result.starts[0].gpus_by_node == {"n1": (0, 1, 2)}


def test_no_wider_start_while_another_job_waits():
    # 2 of 4 GPUs busy for an hour: job 2 (4 GPUs) waits for them; job 1 starts, but only as declared.
    running = [RunningView(9, "t", {"n1": (2, 3)}, NOW - 60, NOW + 3600)]
    pending = [PendingJob(2, "t", 4, 1.0, NOW - 600), PendingJob(1, "t", 2, 0.25, NOW, max_gpus=4)]
    result = _plan([NodeView("n1", 4, (0, 1))], pending, running)
    assert [s.job_id for s in result.starts] == [1] and _held(result, 1) == 2


@settings(max_examples=60, deadline=None)
@given(free=st.integers(0, 8), gpus=st.integers(1, 8), extra=st.integers(0, 8))
def test_a_start_is_never_wider_than_max_gpus_nor_narrower_than_declared(free, gpus, extra):
    result = _plan(
        [NodeView("n1", 8, tuple(range(free)))], [PendingJob(1, "t", gpus, 1.0, NOW, max_gpus=gpus + extra)]
    )
    for start in result.starts:
        assert gpus <= sum(len(ix) for ix in start.gpus_by_node.values()) <= gpus + extra


def test_a_replayed_wider_start_runs_proportionally_shorter():
    jobs = [TraceJob(0, 0, 600, 2, 1.0, "t", max_gpus=4)]
    (outcome,) = simulate.replay(jobs, nodes=1, gpus_per_node=4, policy=plan)
    assert outcome.end == 300 and outcome.gpu_seconds == 4 * 300
