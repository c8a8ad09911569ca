"""A waiting job's reason says what really keeps it waiting, and tells its team nothing of another team's job."""

from datetime import UTC, datetime

from jobs.scheduling.policy import plan
from jobs.scheduling.types import NodeView, PendingJob, RunningView

NOW = datetime(2026, 5, 4, 12, 0, tzinfo=UTC).timestamp()
HOUR = 3600.0


def _plan(pending, running=(), nodes=()):
    return plan(now=NOW, nodes=list(nodes), running=list(running), pending=pending, usage={}, shares={})


# ----- jobs spanning nodes


def test_a_spanning_job_refused_by_nodes_that_cannot_isolate_it_is_told_that_not_that_the_pool_is_too_small():
    """Three 4-GPU nodes (12 GPUs), two of which cannot hold a part of a job spanning nodes: an 8-GPU job can
    never be placed, but the pool is not smaller than it."""
    nodes = [
        NodeView("gpu-01", 4, (0, 1, 2, 3)),
        NodeView("gpu-02", 4, (0, 1, 2, 3), spans=False),
        NodeView("gpu-03", 4, (0, 1, 2, 3), spans=False),
    ]
    e = _plan([PendingJob(1, "vision", 8, 1.0, NOW - 60)], (), nodes).estimates[1]
    assert e.start_at is None and e.reason_code == "span_nodes"
    assert "larger than the pool" not in e.reason and "12 GPUs" not in e.reason, e.reason
    assert "only 1 node large enough can hold a part of a job spanning nodes" in e.reason, e.reason


def test_a_spanning_job_larger_than_the_pool_is_still_told_so():
    nodes = [NodeView("gpu-01", 4, (0, 1, 2, 3)), NodeView("gpu-02", 4, (0, 1, 2, 3), spans=False)]
    e = _plan([PendingJob(1, "vision", 12, 1.0, NOW - 60)], (), nodes).estimates[1]
    assert e.reason_code == "too_large" and e.reason.startswith("larger than the pool can ever place"), (
        e.reason
    )


# ----- what a team is told of another team's job


def test_a_reason_does_not_tell_a_team_the_size_of_another_teams_job():
    """Team vision's 2-GPU job waits behind team audio's 6-GPU job: the reason may say another team's job is
    ahead, but not how many GPUs that team asked for."""
    nodes = [NodeView("gpu-01", 8, ())]
    running = [RunningView(100, "ml-ops", {"gpu-01": tuple(range(8))}, NOW - HOUR, NOW + 2 * HOUR)]
    pending = [PendingJob(1, "audio", 6, 4.0, NOW - 600), PendingJob(2, "vision", 2, 4.0, NOW - 60)]
    e = _plan(pending, running, nodes).estimates[2]
    assert "another team's job" in e.reason
    assert "6 GPU" not in e.reason and "audio" not in e.reason, e.reason


def test_a_reason_tells_a_team_the_size_of_its_own_job_ahead():
    nodes = [NodeView("gpu-01", 8, ())]
    running = [RunningView(100, "ml-ops", {"gpu-01": tuple(range(8))}, NOW - HOUR, NOW + 2 * HOUR)]
    pending = [PendingJob(1, "vision", 6, 4.0, NOW - 600), PendingJob(2, "vision", 2, 4.0, NOW - 60)]
    e = _plan(pending, running, nodes).estimates[2]
    assert "waiting behind job 1 (higher priority, 6 GPUs)" in e.reason, e.reason
