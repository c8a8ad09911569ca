"""Placement by the node's disk: a part's attempt space is taken on its node's disk when it starts, so a job
goes to a node whose disk holds its space rather than to one that would refuse it and spend one of its attempts.
The disk's free figure is a measure taken between beats, so it steers and never holds a job back: where no node has
room, the job is placed by GPUs as before, and the agent's own refusal (back to the queue) decides. What a disk holds
in all is a limit: a space larger than every disk is placed nowhere, and its estimate says why."""

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


def test_where_no_nodes_disk_holds_its_space_a_job_is_placed_by_gpus_and_takes_no_reservation():
    # Its space may exceed every node's disk (never measured against what a disk holds in all): a wait, with a
    # reservation on idle GPUs, could last for ever and keep other jobs off them.
    nodes = [_node("a", (6, 7), free_disk=5 * GB), _node("b", range(8), free_disk=9 * GB)]
    result = _plan(nodes, [_job(1, 2, space=2000 * GB), _job(2, 1, space=GB)])
    assert _placed(result) == {1: {"a": (6, 7)}, 2: {"b": (0,)}}
    assert result.reservations == []


def test_starts_in_one_pass_use_up_a_nodes_disk_one_after_another():
    # "a" is the best GPU fit for each (7 GPUs free against 8), until its disk is used up.
    nodes = [_node("a", range(7), free_disk=25 * GB), _node("b", range(8), free_disk=50 * GB)]
    jobs = [_job(1, 1, space=10 * GB), _job(2, 1, space=10 * GB), _job(3, 1, space=10 * GB)]
    placed = _placed(_plan(nodes, jobs))
    assert sorted(node for counts in placed.values() for node in counts) == ["a", "a", "b"]


def test_a_node_that_advertises_only_its_disk_is_not_refused_for_memory_it_never_offered():
    nodes = [NodeView(name="a", gpus=8, free=tuple(range(8)), free_disk=50 * GB, free_memory=-1.0)]
    assert _placed(_plan(nodes, [_job(1, 1, space=GB)])) == {1: {"a": (0,)}}


def test_a_job_spanning_nodes_needs_its_space_on_each_of_them():
    nodes = [_node("a", range(8), free_disk=5 * GB), _node("b", range(8), free_disk=20 * GB),
             _node("c", range(8), free_disk=20 * GB)]  # fmt: skip
    assert sorted(_placed(_plan(nodes, [_job(1, 16, space=10 * GB)]))[1]) == ["b", "c"]


def test_a_node_that_reports_no_disk_places_by_gpus_alone():
    nodes = [NodeView(name="a", gpus=8, free=tuple(range(8)))]
    assert _placed(_plan(nodes, [_job(1, 8, space=10**15)])) == {1: {"a": tuple(range(8))}}


def _sized(name, free, *, disk):
    return NodeView(name=name, gpus=8, free=tuple(free), free_disk=disk, disk=disk)


def test_a_job_whose_space_is_larger_than_every_nodes_whole_disk_is_told_so_and_waits_for_nothing():
    # Placed, it would only be refused by node after node, spending its attempts; its owner would learn why last.
    nodes = [_sized("a", range(8), disk=100 * GB), _sized("b", range(8), disk=200 * GB)]
    result = _plan(nodes, [_job(1, 1, space=300 * GB), _job(2, 1, space=GB)])
    assert _placed(result) == {2: {"a": (0,)}} and result.reservations == []
    estimate = result.estimates[1]
    assert (estimate.start_at, estimate.reason_code) == (None, "space_too_large")
    assert "300.0 GB" in estimate.reason and "the largest holds 200.0 GB" in estimate.reason, estimate.reason


def test_a_space_only_a_node_not_taking_work_now_holds_waits_for_it_without_a_reservation():
    # Held for a full disk, or draining: back in the pool later, with its disk. Not told to resubmit smaller.
    nodes = [
        _sized("a", range(8), disk=100 * GB),
        NodeView(name="b", gpus=8, free=(), disk=400 * GB, schedulable=False),
    ]
    result = _plan(nodes, [_job(1, 1, space=300 * GB)])
    assert result.starts == [] and result.reservations == []
    estimate = result.estimates[1]
    assert (estimate.start_at, estimate.reason_code) == (None, "space_paused")
    assert "waits until one whose disk holds it" in estimate.reason


def test_a_paused_node_that_does_not_say_what_its_disk_holds_does_not_keep_a_job_too_large_for_every_other_waiting():
    nodes = [_sized("a", range(8), disk=100 * GB), NodeView(name="b", gpus=8, free=(), schedulable=False)]
    assert _plan(nodes, [_job(1, 1, space=300 * GB)]).estimates[1].reason_code == "space_too_large"


def test_while_a_node_does_not_say_what_its_disk_holds_no_job_is_refused_for_its_space():
    nodes = [_sized("a", range(8), disk=100 * GB), NodeView(name="b", gpus=8, free=tuple(range(8)))]
    assert _placed(_plan(nodes, [_job(1, 1, space=300 * GB)])) == {1: {"b": (0,)}}
