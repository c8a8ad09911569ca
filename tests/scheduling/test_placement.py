"""Placement: one node when it fits, best-fit packing, whole nodes for big jobs, elastic and backlog jobs."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.scheduling.policy import plan
from jobs.scheduling.types import NodeView, PendingJob, PolicyConfig, RunningView

NOW = 1_000_000.0


def _plan(nodes, pending, running=(), **config):
    return plan(
        now=NOW,
        nodes=nodes,
        running=list(running),
        pending=pending,
        usage={},
        shares={},
        config=PolicyConfig(**config),
    )


def _node(name, free, gpus=8, **kw):
    return NodeView(name=name, gpus=gpus, free=tuple(free), **kw)


def _job(job_id, gpus, hours=1.0, **kw):
    return PendingJob(
        job_id=job_id, team=kw.pop("team", "t"), gpus=gpus, hours=hours, submitted_at=NOW - 60, **kw
    )


def test_a_job_that_fits_one_node_goes_to_the_node_it_fills_best():
    nodes = [_node("a", range(8)), _node("b", range(4)), _node("c", range(2))]
    result = _plan(nodes, [_job(1, 3)])
    assert [s.gpus_by_node for s in result.starts] == [{"b": (0, 1, 2)}]


def test_an_exact_fit_beats_a_roomier_node():
    nodes = [_node("a", range(8)), _node("b", range(5)), _node("c", range(2))]
    result = _plan(nodes, [_job(1, 2)])
    assert result.starts[0].gpus_by_node == {"c": (0, 1)}


def test_best_fit_packing_keeps_a_whole_node_for_the_next_big_job():
    nodes = [_node("a", range(8)), _node("b", range(8)), _node("c", (6, 7))]
    # Two 2-GPU jobs and one 8-GPU job: first-fit into "a" would leave no whole node for two 8s.
    result = _plan(nodes, [_job(1, 2), _job(2, 8), _job(3, 8)])
    placed = {s.job_id: s.gpus_by_node for s in result.starts}
    assert placed[1] == {"c": (6, 7)}
    assert {next(iter(placed[2])), next(iter(placed[3]))} == {"a", "b"}


def test_a_job_larger_than_a_node_takes_whole_free_nodes():
    nodes = [_node("a", range(4)), _node("b", range(8)), _node("c", range(8)), _node("d", range(8))]
    result = _plan(nodes, [_job(1, 16)])
    (start,) = result.starts
    assert sorted(start.gpus_by_node) == ["b", "c"]
    assert all(len(ix) == 8 for ix in start.gpus_by_node.values())


def test_a_remainder_beyond_whole_nodes_goes_best_fit_on_another_node():
    nodes = [_node("a", range(8)), _node("b", range(3)), _node("c", range(8))]
    result = _plan(nodes, [_job(1, 10)])
    (start,) = result.starts
    counts = {n: len(ix) for n, ix in start.gpus_by_node.items()}
    assert sorted(counts.values()) == [2, 8]
    assert counts.get("b") == 2


def test_placement_prefers_a_node_that_caches_the_jobs_data():
    nodes = [_node("a", range(2)), _node("b", range(8), cached_datasets=frozenset({"imagenet"}))]
    result = _plan(nodes, [_job(1, 2, datasets=frozenset({"imagenet"}))])
    assert list(result.starts[0].gpus_by_node) == ["b"]


def test_draining_nodes_get_no_starts():
    nodes = [_node("a", range(8), schedulable=False), _node("b", range(2))]
    result = _plan(nodes, [_job(1, 4), _job(2, 2)])
    assert [(s.job_id, list(s.gpus_by_node)) for s in result.starts] == [(2, ["b"])]


@settings(max_examples=150, deadline=None)
@given(
    free=st.lists(st.sets(st.integers(0, 7)), min_size=1, max_size=6),
    sizes=st.lists(st.integers(1, 8), min_size=1, max_size=8),
)
def test_placement_never_splits_a_job_that_fits_on_one_node(free, sizes):
    nodes = [_node(f"n{i}", sorted(f)) for i, f in enumerate(free)]
    result = _plan(nodes, [_job(i, g) for i, g in enumerate(sizes)])
    claimed = set()
    for s in result.starts:
        assert len(s.gpus_by_node) == 1
        for node, ix in s.gpus_by_node.items():
            for i in ix:
                assert i in free[int(node[1:])]
                assert (node, i) not in claimed
                claimed.add((node, i))


def test_an_elastic_job_starts_smaller_rather_than_wait():
    nodes = [_node("a", range(5)), _node("b", range(2))]
    result = _plan(nodes, [_job(1, 8, min_gpus=2)])
    assert [s.gpus_by_node for s in result.starts] == [{"a": (0, 1, 2, 3, 4)}]
    assert result.estimates[1].reason_code == "starting_smaller"


def test_an_elastic_job_takes_its_full_size_when_it_fits():
    result = _plan([_node("a", range(8))], [_job(1, 8, min_gpus=2)])
    assert result.starts[0].gpus_by_node == {"a": tuple(range(8))}


def test_an_elastic_job_below_its_minimum_waits():
    result = _plan([_node("a", range(1))], [_job(1, 8, min_gpus=2)])
    assert result.starts == []


def _backlog(job_id, gpus_by_node, end=NOW + 50 * 3600, checkpoints=False, yield_s=0.0, asked_at=None):
    return RunningView(
        job_id, "batch", gpus_by_node, NOW - 3600, end, preemptible=True, checkpoints=checkpoints,
        yield_s=yield_s, preempt_asked_at=asked_at,
    )  # fmt: skip


def test_backlog_jobs_are_preempted_for_a_job_that_would_otherwise_wait():
    running = [_backlog(7, {"a": (0, 1, 2, 3)}), _backlog(8, {"a": (4, 5, 6, 7)})]
    result = _plan([_node("a", ())], [_job(1, 6)], running)
    assert sorted(result.preemptions) == [7, 8]
    assert result.starts == []  # it starts once they have yielded the GPUs
    (hold,) = result.reservations
    assert hold.start_at == NOW and hold.gpus_by_node == {"a": tuple(range(6))}
    assert result.estimates[1].reason_code == "preempting"


def test_a_job_waiting_on_a_preemption_is_told_when_the_backlog_jobs_will_have_stopped():
    """A preempted job has its checkpoint's grace (up to an hour) or the kill grace to stop: the job waiting for
    its GPUs was told "starting now" all that time. Its estimate is when the last of them will have stopped, from
    when each was asked (a job asked in an earlier pass has less of its grace left)."""
    running = [
        _backlog(7, {"a": (0, 1, 2, 3)}, checkpoints=True, yield_s=600),
        _backlog(8, {"a": (4, 5, 6, 7)}, yield_s=30, asked_at=NOW - 20),
    ]
    result = _plan([_node("a", ())], [_job(1, 8)], running)
    estimate = result.estimates[1]
    assert estimate.reason_code == "preempting" and estimate.start_at == NOW + 600
    assert "have up to 10 minutes to stop" in estimate.reason, estimate.reason
    asked = [_backlog(8, {"a": tuple(range(8))}, yield_s=30, asked_at=NOW - 20)]
    assert _plan([_node("a", ())], [_job(1, 8)], asked).estimates[1].start_at == NOW + 10


def test_preemption_takes_idle_gpus_first_and_as_few_backlog_jobs_as_possible():
    running = [_backlog(7, {"a": (4, 5)}), _backlog(8, {"a": (6, 7)}), _backlog(9, {"b": tuple(range(8))})]
    result = _plan([_node("a", (0, 1, 2, 3)), _node("b", ())], [_job(1, 6)], running)
    assert len(result.preemptions) == 1 and result.preemptions[0] in (7, 8)


@pytest.mark.parametrize("checkpointing", [7, 8])
def test_a_checkpointing_backlog_job_is_preempted_before_one_that_would_start_over(checkpointing):
    running = [_backlog(j, {"a": (0, 1, 2, 3) if j == 7 else (4, 5, 6, 7)}, checkpoints=j == checkpointing)
               for j in (7, 8)]  # fmt: skip
    result = _plan([_node("a", ())], [_job(1, 4)], running)
    assert result.preemptions == [checkpointing]
    (hold,) = result.reservations
    assert hold.gpus_by_node == {"a": running[checkpointing - 7].gpus_by_node["a"]}


def test_checkpointing_jobs_make_room_first_even_when_more_of_them_must_stop():
    # Two small checkpointing jobs lose at most the time since their checkpoints; the big one would lose it all.
    running = [
        _backlog(7, {"a": (0, 1, 2, 3)}),
        _backlog(8, {"a": (4, 5)}, checkpoints=True),
        _backlog(9, {"a": (6, 7)}, checkpoints=True),
    ]
    result = _plan([_node("a", ())], [_job(1, 4)], running)
    assert sorted(result.preemptions) == [8, 9]


def test_a_non_checkpointing_job_is_preempted_when_the_checkpointing_ones_are_not_enough():
    running = [_backlog(7, {"a": (0, 1, 2, 3)}), _backlog(8, {"a": (4, 5)}, checkpoints=True)]
    result = _plan([_node("a", (6, 7))], [_job(1, 8)], running)
    assert sorted(result.preemptions) == [7, 8]


def test_backlog_gpus_never_push_a_reservation_later():
    # The backlog job declares 50 h more; the waiting job's start must not wait for it.
    running = [
        _backlog(7, {"a": tuple(range(8))}),
        RunningView(5, "x", {"b": tuple(range(8))}, NOW - 10, NOW + 3600),
    ]
    result = _plan([_node("a", ()), _node("b", ())], [_job(1, 16)], running)
    (hold,) = result.reservations
    assert hold.start_at == NOW + 3600
    assert result.preemptions == []  # not yet: only when it is due


def test_a_pending_backlog_job_only_takes_gpus_nobody_waiting_can_use():
    older_backlog = PendingJob(1, "t", 2, 1.0, NOW - 9999, preemptible=True)
    result = _plan([_node("a", range(4))], [older_backlog, _job(2, 4, hours=5)])
    assert [s.job_id for s in result.starts] == [2]


def test_a_node_that_cannot_isolate_spanning_jobs_gets_no_part_of_one_but_still_runs_one_node_jobs():
    nodes = [
        _node("a", range(8), spans=False),
        _node("b", range(8)),
        _node("c", range(8)),
        _node("d", range(2)),
    ]
    result = _plan(nodes, [_job(1, 10), _job(2, 8)])
    placed = {s.job_id: s.gpus_by_node for s in result.starts}
    assert set(placed[1]) <= {"b", "c", "d"} and len(placed[1]) == 2
    assert "a" in placed[2]  # a one-node job still goes there


def test_a_spanning_job_waits_rather_than_take_a_part_on_a_node_that_refuses():
    nodes = [_node("a", range(8), spans=False), _node("b", range(8))]
    result = _plan(nodes, [_job(1, 16)])
    assert result.starts == []
