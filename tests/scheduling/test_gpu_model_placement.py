"""A job that asks for a GPU model runs only on nodes of that model: placed, reserved for, backfilled and
estimated on them alone; with none of them taking work it gets no start and a reason naming the model."""

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from jobs import scheduler
from jobs.scheduling import placement
from jobs.scheduling.policy import plan
from jobs.scheduling.types import NodeView, PendingJob, PolicyConfig, RunningView
from tests.factories import JobFactory, NodeFactory

NOW = datetime(2026, 5, 4, 12, 0, tzinfo=UTC).timestamp()
HOUR = 3600.0
GB = 1e9
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"


def _plan(pending, running=(), nodes=()):
    return plan(now=NOW, nodes=list(nodes), running=list(running), pending=pending, usage={}, shares={})


def _node(name, gpus, free=None, model=H100, **kw):
    return NodeView(name, gpus, tuple(range(gpus)) if free is None else free, gpu_model=model, **kw)


def test_a_job_naming_a_model_is_placed_on_a_node_of_that_model_even_where_best_fit_is_another():
    nodes = [_node("a-01", 2, model=A100), _node("h-01", 8)]
    result = _plan([PendingJob(1, "vision", 2, 1.0, NOW, gpu_model="H100")], nodes=nodes)
    assert [(s.job_id, list(s.gpus_by_node)) for s in result.starts] == [(1, ["h-01"])]


def test_the_model_is_matched_as_intake_matches_it_case_aside():
    nodes = [_node("a-01", 8, model=A100), _node("h-01", 8)]
    result = _plan([PendingJob(1, "vision", 1, 1.0, NOW, gpu_model="h100")], nodes=nodes)
    assert list(result.starts[0].gpus_by_node) == ["h-01"]


def test_with_no_node_of_its_model_up_a_job_gets_no_start_and_a_reason_naming_the_model():
    """The H100 node went down (the snapshot leaves it out) and an A100 node joined."""
    result = _plan(
        [PendingJob(1, "vision", 1, 1.0, NOW, gpu_model="H100")], nodes=[_node("a-01", 8, model=A100)]
    )
    assert result.starts == [] and result.reservations == []
    e = result.estimates[1]
    assert e.start_at is None and e.reason_code == "gpu_model"
    assert e.reason.startswith("asks for 1 H100 GPU: no node with H100 GPUs is taking jobs now")


def test_a_drained_node_of_its_model_is_a_pause_not_a_limit():
    nodes = [_node("h-01", 8, schedulable=False), _node("a-01", 8, model=A100)]
    e = _plan([PendingJob(1, "vision", 4, 1.0, NOW, gpu_model="H100")], nodes=nodes).estimates[1]
    assert e.start_at is None and e.reason_code == "drained_capacity"
    assert "H100" in e.reason and "until it takes jobs again" in e.reason


def test_more_gpus_than_its_models_nodes_have_is_said_with_the_model():
    nodes = [_node("h-01", 4), _node("a-01", 8, model=A100), _node("a-02", 8, model=A100)]
    e = _plan([PendingJob(1, "vision", 8, 1.0, NOW, gpu_model="H100")], nodes=nodes).estimates[1]
    assert e.start_at is None and e.reason_code == "gpu_model"
    assert "have 4 of them" in e.reason


def test_a_blocked_job_is_reserved_on_its_models_busy_node_not_started_on_an_idle_other_one():
    nodes = [_node("h-01", 4, free=()), _node("a-01", 4, model=A100)]
    running = [RunningView(9, "audio", {"h-01": (0, 1, 2, 3)}, NOW - HOUR, NOW + 3 * HOUR)]
    result = _plan([PendingJob(1, "vision", 2, 1.0, NOW - 60, gpu_model="H100")], running, nodes)
    assert result.starts == []
    [hold] = result.reservations
    assert (hold.job_id, hold.start_at, list(hold.gpus_by_node)) == (1, NOW + 3 * HOUR, ["h-01"])
    assert result.estimates[1].start_at == NOW + 3 * HOUR


def test_a_job_behind_the_reservation_is_neither_backfilled_onto_another_model_nor_promised_its_gpus():
    """Job 2 (H100, 4 GPUs) comes after job 1's reservation: the idle A100 node would take it now, and the pool's
    idle GPUs would say 13:00; its H100s are busy until 15:00 and then held by job 1 until 16:00."""
    nodes = [_node("h-01", 4, free=()), _node("a-01", 4, model=A100)]
    running = [RunningView(9, "audio", {"h-01": (0, 1, 2, 3)}, NOW - HOUR, NOW + 3 * HOUR)]
    pending = [
        PendingJob(1, "vision", 2, 1.0, NOW - 120, gpu_model="H100"),
        PendingJob(2, "vision", 4, 1.0, NOW - 60, gpu_model="H100"),
        PendingJob(3, "vision", 4, 1.0, NOW - 30),
    ]
    result = _plan(pending, running, nodes)
    assert [(s.job_id, list(s.gpus_by_node)) for s in result.starts] == [(3, ["a-01"])]
    e = result.estimates[2]
    assert e.start_at == NOW + 4 * HOUR, e.reason
    assert "the H100 GPUs it asked for are busy until then" in e.reason


def test_a_job_spanning_nodes_takes_whole_nodes_of_its_model():
    nodes = [_node("a-01", 8, model=A100), _node("h-01", 4), _node("h-02", 4), _node("a-02", 8, model=A100)]
    result = _plan([PendingJob(1, "vision", 8, 1.0, NOW, gpu_model="H100")], nodes=nodes)
    assert result.starts[0].gpus_by_node == {"h-01": (0, 1, 2, 3), "h-02": (0, 1, 2, 3)}


def test_a_reservation_spanning_nodes_waits_for_whole_nodes_of_its_model():
    nodes = [_node("h-01", 4, free=(2, 3)), _node("h-02", 4, free=()), _node("a-01", 8, model=A100)]
    running = [
        RunningView(8, "audio", {"h-01": (0, 1)}, NOW - HOUR, NOW + HOUR),
        RunningView(9, "audio", {"h-02": (0, 1, 2, 3)}, NOW - HOUR, NOW + 2 * HOUR),
    ]
    result = _plan([PendingJob(1, "vision", 8, 1.0, NOW - 60, gpu_model="H100")], running, nodes)
    assert result.starts == []
    [hold] = result.reservations
    assert hold.start_at == NOW + 2 * HOUR and sorted(hold.gpus_by_node) == ["h-01", "h-02"]


def test_an_elastic_job_starts_smaller_on_its_model_only():
    nodes = [_node("h-01", 4, free=(2, 3)), _node("a-01", 8, model=A100)]
    running = [RunningView(9, "audio", {"h-01": (0, 1)}, NOW - HOUR, NOW + 3 * HOUR)]
    result = _plan([PendingJob(1, "vision", 4, 1.0, NOW, min_gpus=1, gpu_model="H100")], running, nodes)
    assert result.starts[0].gpus_by_node == {"h-01": (2, 3)}


def test_an_elastic_jobs_smaller_start_is_not_promised_on_another_models_node():
    """Job 1 (H100, 8 GPUs, at least 4) is reserved on h-01 from 22:00; the A100 node frees at 13:00 but can
    never take it, so 22:00 is when it starts, not 13:00 on fewer GPUs."""
    nodes = [_node("h-01", 8, free=()), _node("a-01", 8, free=(), model=A100)]
    running = [
        RunningView(8, "audio", {"h-01": tuple(range(8))}, NOW - HOUR, NOW + 10 * HOUR),
        RunningView(9, "audio", {"a-01": tuple(range(8))}, NOW - HOUR, NOW + 1 * HOUR),
    ]
    job = PendingJob(1, "vision", 8, 1.0, NOW - 60, min_gpus=4, gpu_model="H100")
    result = _plan([job], running, nodes)
    [hold] = result.reservations
    assert list(hold.gpus_by_node) == ["h-01"] and hold.start_at == NOW + 10 * HOUR
    e = result.estimates[1]
    assert (e.start_at, e.reason_code) == (NOW + 10 * HOUR, "reserved"), e.reason


def test_a_job_held_back_by_memory_is_not_told_another_models_node_frees_it():
    """Both nodes have 4 idle GPUs but their memory held: h-01's until 22:00, a-01's (A100) until 13:00. A job
    naming H100 frees at 22:00; the same job naming no model, asked about first in the pass, at 13:00."""
    nodes = [
        _node("h-01", 8, free=(4, 5, 6, 7), memory=800 * GB, free_memory=50 * GB),
        _node("a-01", 8, free=(4, 5, 6, 7), model=A100, memory=800 * GB, free_memory=50 * GB),
    ]
    running = [
        RunningView(8, "audio", {"h-01": (0, 1, 2, 3)}, NOW - HOUR, NOW + 10 * HOUR),
        RunningView(9, "audio", {"a-01": (0, 1, 2, 3)}, NOW - HOUR, NOW + 1 * HOUR),
    ]
    pending = [
        PendingJob(1, "vision", 4, 1.0, NOW - 120, memory=300 * GB),
        PendingJob(2, "vision", 4, 1.0, NOW - 60, memory=300 * GB, gpu_model="H100"),
    ]
    estimates = _plan(pending, running, nodes).estimates
    assert {j: (e.start_at, e.reason_code) for j, e in estimates.items()} == {
        1: (NOW + HOUR, "no_room"),
        2: (NOW + 10 * HOUR, "no_room"),
    }
    assert "about 22:00 UTC" in estimates[2].reason


@pytest.mark.parametrize(
    ("gpus", "h100s", "where"),
    [(4, [8], "on one node"), (8, [4, 4], "split over the nodes that hold its parts, by GPUs")],
)
def test_a_job_its_models_nodes_cannot_hold_by_memory_is_told_so_by_those_nodes(gpus, h100s, where):
    """Its H100 nodes offer 200 GB each, the A100 node 1 TB: it is not 'larger than the pool', nor judged by the
    A100's memory or size."""
    nodes = [_node(f"h-{i:02}", k, memory=200 * GB, free_memory=200 * GB) for i, k in enumerate(h100s, 1)]
    nodes.append(_node("a-01", 8, model=A100, memory=1000 * GB, free_memory=1000 * GB))
    job = PendingJob(1, "vision", gpus, 1.0, NOW - 60, memory=gpus * 125 * GB, gpu_model="H100")
    e = _plan([job], (), nodes).estimates[1]
    assert (e.start_at, e.reason_code) == (None, "room_too_large"), e.reason
    assert where in e.reason
    assert "a node with H100 GPUs of 4 GPUs or more offers at most 200.0 GB of memory" in e.reason


def test_a_jobs_size_is_described_by_its_models_nodes():
    """8 GPUs on 4-GPU H100 nodes span two whole nodes, reserved or waiting behind: the pool's largest node, an
    8-GPU A100, would say 'on one node'."""
    nodes = [_node("h-01", 4, free=()), _node("h-02", 4, free=()), _node("a-01", 8, free=(), model=A100)]
    running = [
        RunningView(8, "audio", {"h-01": (0, 1, 2, 3), "h-02": (0, 1, 2, 3)}, NOW - HOUR, NOW + 2 * HOUR),
        RunningView(9, "audio", {"a-01": tuple(range(8))}, NOW - HOUR, NOW + 5 * HOUR),
    ]
    pending = [PendingJob(j, "vision", 8, 1.0, NOW - 60 + j, gpu_model="H100") for j in (1, 2)]
    result = _plan(pending, running, nodes)
    [hold] = result.reservations
    assert sorted(hold.gpus_by_node) == ["h-01", "h-02"]
    assert [result.estimates[j].reason_code for j in (1, 2)] == ["reserved", "queued"]
    for e in (result.estimates[1], result.estimates[2]):
        assert e.reason.startswith("needs 8 GPUs: 2 whole nodes;"), e.reason


@pytest.mark.parametrize(
    ("model", "gpus", "held", "at"),
    [("H100", 16, ["h-01"], 10), (None, 24, ["h-01", "a-01"], 14)],
)
def test_an_elastic_hold_that_never_fits_whole_holds_the_most_it_can_and_the_next_is_counted_after_it(
    model, gpus, held, at
):
    """Job 1 (elastic, at least 8) could start on one node, but no hold for all its GPUs ever fits: it holds the
    most its model's nodes ever give (the H100 node from 22:00; both nodes once a-01 frees at 02:00), and job 2 is
    reserved on GPUs free after that hold, not counted on the GPUs free after every release."""
    nodes = [_node("h-01", 8, free=()), _node("a-01", 8, free=(), model=A100)]
    running = [
        RunningView(8, "audio", {"h-01": tuple(range(8))}, NOW - HOUR, NOW + 10 * HOUR),
        RunningView(9, "audio", {"a-01": tuple(range(8))}, NOW - HOUR, NOW + 14 * HOUR),
    ]
    order = [
        PendingJob(1, "vision", gpus, 1.0, NOW - 7200, min_gpus=8, gpu_model=model),
        PendingJob(2, "vision", 8, 1.0, NOW - 60),
    ]
    config = PolicyConfig(reserve_top=2, max_reservations=2)
    result = placement.schedule(now=NOW, nodes=nodes, running=running, order=order, config=config)
    assert [(r.job_id, r.start_at, sorted(r.gpus_by_node)) for r in result.reservations] == [
        (1, NOW + at * HOUR, sorted(held)),
        (2, NOW + (at + 1) * HOUR, ["h-01"]),
    ]


@st.composite
def pools(draw):
    nodes, running, jid = [], [], 1000
    for i in range(draw(st.integers(1, 5))):
        gpus = draw(st.sampled_from([2, 4, 8]))
        model = draw(st.sampled_from([H100, A100, "virtual"]))
        busy = draw(st.integers(0, gpus))
        if busy:
            end = NOW + draw(st.integers(1, 10)) * HOUR
            running.append(RunningView(jid, "audio", {f"n{i}": tuple(range(busy))}, NOW - HOUR, end))
            jid += 1
        nodes.append(NodeView(f"n{i}", gpus, tuple(range(busy, gpus)), gpu_model=model))
    pending = [
        PendingJob(
            j,
            draw(st.sampled_from(["vision", "audio"])),
            draw(st.sampled_from([1, 2, 4, 8, 12])),
            float(draw(st.integers(1, 4))),
            NOW - draw(st.integers(0, 10)) * 600,
            gpu_model=draw(st.sampled_from([None, None, "H100", "A100"])),
        )
        for j in range(1, draw(st.integers(1, 8)) + 1)
    ]
    return nodes, running, pending


@given(pools())
def test_no_start_or_reservation_lands_on_a_node_of_another_model(pool):
    nodes, running, pending = pool
    result = _plan(pending, running, nodes)
    model_of = {n.name: n.gpu_model for n in nodes}
    asked = {p.job_id: p.gpu_model for p in pending}
    for job_id, where in [(s.job_id, s.gpus_by_node) for s in result.starts] + [
        (r.job_id, r.gpus_by_node) for r in result.reservations
    ]:
        if asked[job_id]:
            assert all(asked[job_id] in model_of[node] for node in where), (job_id, where)
    assert set(result.estimates) == set(asked)


@given(pools())
def test_jobs_naming_no_model_are_planned_as_on_a_pool_that_says_no_model(pool):
    nodes, running, pending = pool
    anonymous = [NodeView(n.name, n.gpus, n.free) for n in nodes]
    pending = [p for p in pending if p.gpu_model is None]
    said, unsaid = _plan(pending, running, nodes), _plan(pending, running, anonymous)
    assert (said.starts, said.reservations, said.estimates) == (
        unsaid.starts,
        unsaid.reservations,
        unsaid.estimates,
    )


@pytest.mark.django_db
def test_a_job_asking_for_a_gpu_model_no_node_has_is_not_started_on_another_model(team):
    """Submitted while the pool had H100s (the only time a model is accepted); the H100 node has gone and an
    A100 node joined. The job must not be placed on the A100, and must be told why it waits."""
    NodeFactory(name="gpu-h100", gpu_model="NVIDIA H100 80GB HBM3", state="down")
    NodeFactory(name="gpu-a100", gpu_model="NVIDIA A100-SXM4-80GB")
    job = JobFactory(team=team, gpu_model="H100", gpus=1, submitted_at=timezone.now() - timedelta(minutes=5))
    scheduler.run_pass(now=timezone.now())
    job.refresh_from_db()
    assert job.state == "queued", (
        f"{job.state} on {list(job.allocations.values_list('node__name', flat=True))}"
    )
    assert job.estimated_start is None
    assert job.pending_reason.startswith("asks for 1 H100 GPU: no node with H100 GPUs is taking jobs now")


@pytest.mark.django_db
def test_a_job_asking_for_a_gpu_model_is_rented_on_a_node_of_it(team):
    NodeFactory(name="gpu-a100", gpu_model="NVIDIA A100-SXM4-80GB", gpus=2)
    NodeFactory(name="gpu-h100", gpu_model="NVIDIA H100 80GB HBM3", gpus=8)
    job = JobFactory(team=team, gpu_model="H100", gpus=2, submitted_at=timezone.now() - timedelta(minutes=5))
    scheduler.run_pass(now=timezone.now())
    job.refresh_from_db()
    assert job.state == "rented"
    assert list(job.allocations.values_list("node__name", flat=True)) == ["gpu-h100"]


@given(pools(), st.booleans())
def test_on_a_pool_of_one_model_asking_for_it_changes_no_decision(pool, spans):
    """Every node an H100 one: a job asking for H100 is placed, reserved for and estimated as one asking for none
    (the model's own walk over releases agrees with the pool's)."""
    nodes, running, pending = pool
    nodes = [
        NodeView(n.name, n.gpus, n.free, gpu_model=H100, spans=spans or i % 2 == 0)
        for i, n in enumerate(nodes)
    ]
    running = [RunningView(r.job_id, r.team, r.gpus_by_node, r.started_at, r.expected_end) for r in running]
    asking = [dataclasses.replace(p, gpu_model="H100") for p in pending]
    anyone = [dataclasses.replace(p, gpu_model=None) for p in pending]
    a, b = _plan(asking, running, nodes), _plan(anyone, running, nodes)
    assert (a.starts, a.reservations, a.preemptions) == (b.starts, b.reservations, b.preemptions)
    assert {j: e.start_at for j, e in a.estimates.items()} == {j: e.start_at for j, e in b.estimates.items()}
