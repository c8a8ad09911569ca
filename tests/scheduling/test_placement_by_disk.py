"""Placement by the node's disk: a part's attempt space is taken on its node's disk when it starts, so a
node whose disk cannot hold it is passed over, instead of refusing the part and spending one of the job's
attempts."""

from jobs.scheduling.policy import plan
from jobs.scheduling.types import NodeView, PendingJob, PolicyConfig

NOW = 1_000_000.0
GB = 10**9


def _plan(nodes, pending):
    return plan(now=NOW, nodes=nodes, running=[], pending=pending, usage={}, shares={}, config=PolicyConfig())


def _node(name, free, *, free_disk):
    return NodeView(name=name, gpus=8, free=tuple(free), free_disk=free_disk)


def _job(job_id, gpus, space):
    return PendingJob(
        job_id=job_id, team="t", gpus=gpus, hours=1.0, submitted_at=NOW - 60 + job_id, space=space
    )


def _placed(result):
    return {s.job_id: s.gpus_by_node for s in result.starts}


def test_a_job_goes_past_the_best_gpu_fit_to_a_node_whose_disk_holds_its_space():
    nodes = [_node("a", (6, 7), free_disk=5 * GB), _node("b", range(8), free_disk=50 * GB)]
    assert _placed(_plan(nodes, [_job(1, 2, space=10 * GB)])) == {1: {"b": (0, 1)}}


def test_a_job_waits_saying_so_when_no_nodes_disk_holds_its_space():
    nodes = [_node("a", range(8), free_disk=5 * GB), _node("b", range(8), free_disk=9 * GB)]
    result = _plan(nodes, [_job(1, 1, space=10 * GB)])
    assert result.starts == []
    assert result.estimates[1].reason_code == "no_room"
    assert (
        "its GPUs are idle, but no node has its memory, CPUs and disk space free yet"
        in result.estimates[1].reason
    )


def test_starts_in_one_pass_use_up_a_nodes_disk_one_after_another():
    nodes = [_node("a", range(8), free_disk=25 * GB)]
    jobs = [_job(1, 1, space=10 * GB), _job(2, 1, space=10 * GB), _job(3, 1, space=10 * GB)]
    assert set(_placed(_plan(nodes, jobs))) == {1, 2}


def test_a_job_spanning_nodes_needs_its_space_on_each_of_them():
    nodes = [_node("a", range(8), free_disk=5 * GB), _node("b", range(8), free_disk=20 * GB),
             _node("c", range(8), free_disk=20 * GB)]  # fmt: skip
    assert sorted(_placed(_plan(nodes, [_job(1, 16, space=10 * GB)]))[1]) == ["b", "c"]


def test_a_node_that_reports_no_disk_places_by_gpus_alone():
    nodes = [NodeView(name="a", gpus=8, free=tuple(range(8)))]
    assert _placed(_plan(nodes, [_job(1, 8, space=10**15)])) == {1: {"a": tuple(range(8))}}
