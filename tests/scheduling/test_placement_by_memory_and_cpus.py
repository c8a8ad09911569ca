"""Placement by memory and CPUs as well as GPUs: a node must have the job's share of each free."""

from jobs.scheduling.policy import plan
from jobs.scheduling.types import NodeView, PendingJob, PolicyConfig, RunningView, part_share

NOW = 1_000_000.0
GB = 10**9


def _plan(nodes, pending):
    return plan(now=NOW, nodes=nodes, running=[], pending=pending, usage={}, shares={}, config=PolicyConfig())


def _node(name, free, *, memory=64 * GB, cpus=16.0, free_memory=None, free_cpus=None, gpus=8):
    return NodeView(
        name=name, gpus=gpus, free=tuple(free), memory=memory, cpus=cpus,
        free_memory=memory if free_memory is None else free_memory,
        free_cpus=cpus if free_cpus is None else free_cpus,
    )  # fmt: skip


def _job(job_id, gpus, **kw):
    return PendingJob(job_id=job_id, team="t", gpus=gpus, hours=1.0, submitted_at=NOW - 60 + job_id, **kw)


def _placed(result):
    return {s.job_id: s.gpus_by_node for s in result.starts}


def test_a_job_goes_past_the_best_gpu_fit_to_a_node_with_its_memory_free():
    # "a" fits 2 GPUs best, but its running jobs left 10 GB: the 40 GB job goes to "b".
    nodes = [_node("a", (6, 7), free_memory=10 * GB), _node("b", range(8))]
    assert _placed(_plan(nodes, [_job(1, 2, memory=40 * GB)])) == {1: {"b": (0, 1)}}


def test_a_job_waits_when_no_node_has_its_cpus_free_though_gpus_are_idle():
    nodes = [_node("a", range(8), free_cpus=3), _node("b", range(8), free_cpus=2)]
    result = _plan(nodes, [_job(1, 1, cpus=4)])
    assert result.starts == []
    assert result.estimates[1].reason_code == "no_room"
    assert "its GPUs are idle, but no node has its memory and CPUs free yet" in result.estimates[1].reason


def test_an_undeclared_job_needs_the_nodes_share_for_its_gpus():
    # 4 of 8 GPUs want half the node's 64 GB; "a" has only 20 GB left, "b" its 32 GB.
    nodes = [_node("a", range(4), free_memory=20 * GB), _node("b", range(4), free_memory=32 * GB)]
    assert _placed(_plan(nodes, [_job(1, 4)])) == {1: {"b": (0, 1, 2, 3)}}


def test_starts_in_one_pass_use_up_a_nodes_memory_one_after_another():
    nodes = [_node("a", range(8))]
    jobs = [_job(1, 1, memory=40 * GB), _job(2, 1, memory=40 * GB), _job(3, 1, memory=20 * GB)]
    placed = _placed(_plan(nodes, jobs))
    assert set(placed) == {1, 3}  # 40 + 20 of 64 GB; the second 40 GB job waits


def test_a_job_spanning_nodes_needs_its_share_on_each_node():
    # 16 GPUs with 96 GB: 48 GB on each whole node. "a" has 30 GB free, so "b" and "c" are taken.
    nodes = [_node("a", range(8), free_memory=30 * GB), _node("b", range(8)), _node("c", range(8))]
    assert sorted(_placed(_plan(nodes, [_job(1, 16, memory=96 * GB)]))[1]) == ["b", "c"]


def test_nodes_that_advertise_nothing_place_by_gpus_alone_as_trace_replays_do():
    nodes = [NodeView(name="a", gpus=8, free=tuple(range(8)))]
    assert _placed(_plan(nodes, [_job(1, 8, memory=10**15, cpus=10**4)])) == {1: {"a": tuple(range(8))}}


def test_the_share_is_split_by_gpus_and_defaults_to_the_nodes_share():
    assert part_share(declared=48 * GB, job_gpus=12, node_total=64 * GB, node_gpus=8, gpus_here=4) == 16 * GB
    assert part_share(declared=None, job_gpus=12, node_total=64 * GB, node_gpus=8, gpus_here=4) == 32 * GB


def test_an_elastic_job_started_on_fewer_gpus_needs_its_whole_declaration_on_them():
    # 64 GB declared for 8 GPUs, at least 4: started on 4 it needs all 64 GB there, not 32.
    elastic = {"memory": 64 * GB, "min_gpus": 4}
    assert _placed(_plan([_node("a", range(4), free_memory=40 * GB)], [_job(1, 8, **elastic)])) == {}
    assert _placed(_plan([_node("a", range(4))], [_job(1, 8, **elastic)])) == {1: {"a": (0, 1, 2, 3)}}


def test_a_job_no_node_could_ever_give_its_memory_or_cpus_is_told_so_not_promised_a_start():
    """An idle pool, nothing running: 100 GB (or 20 CPUs) for 1 GPU fits no 64 GB, 16-CPU node whatever ends, so
    no start is promised, and the reason says what it asked, what the nodes offer and what to do."""
    nodes = [_node("a", range(4), gpus=4), _node("b", range(4), gpus=4)]
    for job, asked, most in (
        (
            _job(1, 1, memory=100 * GB),
            "100.0 GB of memory for 1 GPU, on one node",
            "at most 64.0 GB of memory",
        ),
        (_job(2, 1, cpus=20), "20 CPUs for 1 GPU, on one node", "at most 16 CPUs"),
    ):
        estimate = _plan(nodes, [job]).estimates[job.job_id]
        assert (estimate.start_at, estimate.reason_code) == (None, "room_too_large")
        assert asked in estimate.reason and most in estimate.reason, estimate.reason


def test_a_spanning_job_is_judged_by_the_share_of_each_part():
    # 8 GPUs on 4-GPU nodes: 2 parts of half the job's memory. 120 GB fits (60 GB a part), 140 GB never does.
    nodes = [_node(n, range(4), gpus=4) for n in "abc"]
    assert _placed(_plan(nodes, [_job(1, 8, memory=120 * GB)])) == {1: {"a": (0, 1, 2, 3), "b": (0, 1, 2, 3)}}
    assert _plan(nodes, [_job(2, 8, memory=140 * GB)]).estimates[2].reason_code == "room_too_large"


# ----- a reservation its job cannot use


def test_a_job_only_memory_holds_back_takes_no_reservation_that_keeps_idle_gpus_from_others():
    """Found by trying it: a job declaring a whole node's memory and a short limit (ranked first) got a reservation due
    now on 7 idle GPUs of a node whose memory a 1-GPU job held for 160 h. It could not start there, and nothing
    else could use the 7 GPUs: every pass renewed the hold, its team was never billed, and a 7-GPU job of another
    team waited behind it. Held back by memory or CPUs only, it gets no reservation until it is starved; the next
    job reserves, or starts, instead."""
    nodes = [_node("a", range(1, 8), free_memory=56 * GB), _node("b", range(1, 8), free_memory=56 * GB)]
    running = [
        RunningView(job_id=100 + i, team="other", gpus_by_node={n: (0,)}, started_at=NOW - 3600,
                    expected_end=NOW + 160 * 3600)
        for i, n in enumerate(("a", "b"))
    ]  # fmt: skip
    victims = [PendingJob(i, "victim", 7, 10.0, NOW - 600) for i in (1, 2)]
    hog = PendingJob(9, "hog", 7, 0.25, NOW - 60, memory=64 * GB)
    result = plan(now=NOW, nodes=nodes, running=running, pending=[*victims, hog], usage={"victim": 1e6},
                  shares={}, config=PolicyConfig())  # fmt: skip
    assert sorted(_placed(result)) == [1, 2]
    assert 9 not in {r.job_id for r in result.reservations}
    told = result.estimates[9]  # the victims took the GPUs: it waits for GPUs and memory, never told "now"
    assert told.reason_code == "no_gpus" and told.start_at > NOW


def test_a_starved_job_held_back_by_memory_still_holds_its_reservation():
    """Liveness: past the starvation bound it keeps GPUs for itself, or small jobs would take each node's GPUs and
    memory as they free, for ever."""
    nodes = [_node("a", range(1, 8), free_memory=56 * GB)]
    running = [RunningView(job_id=100, team="other", gpus_by_node={"a": (0,)}, started_at=NOW - 3600,
                           expected_end=NOW + 2 * 3600)]  # fmt: skip
    old = PendingJob(9, "heavy", 7, 1.0, NOW - 30 * 86400, memory=64 * GB)
    small = PendingJob(1, "other", 1, 10.0, NOW - 60)
    result = plan(now=NOW, nodes=nodes, running=running, pending=[old, small], usage={}, shares={},
                  config=PolicyConfig())  # fmt: skip
    assert 9 in {r.job_id for r in result.reservations} and 1 not in _placed(result)
