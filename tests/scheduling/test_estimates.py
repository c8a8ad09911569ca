"""Every pending job gets an estimate with a sentence its owner can act on."""

import math
import re
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.scheduling.explanation import format_utc
from jobs.scheduling.policy import plan
from jobs.scheduling.types import NodeView, PendingJob, PolicyConfig, RunningView

NOW = datetime(2026, 5, 4, 12, 0, tzinfo=UTC).timestamp()
HOUR = 3600.0


def _busy_pool():
    nodes = [NodeView("gpu-01", 8, ()), NodeView("gpu-02", 8, (6, 7)), NodeView("gpu-03", 8, ())]
    running = [
        RunningView(100, "ml-ops", {"gpu-01": tuple(range(8))}, NOW - HOUR, NOW + 2 * HOUR + 20 * 60),
        RunningView(101, "ml-ops", {"gpu-02": tuple(range(6))}, NOW - HOUR, NOW + 5 * HOUR),
        RunningView(102, "vision", {"gpu-03": tuple(range(8))}, NOW - HOUR, NOW + 8 * HOUR),
    ]
    return nodes, running


def test_a_reserved_job_is_told_where_and_when():
    nodes, running = _busy_pool()
    result = plan(
        now=NOW,
        nodes=nodes,
        running=running,
        pending=[PendingJob(1, "vision", 8, 4.0, NOW - 60)],
        usage={},
        shares={},
    )
    e = result.estimates[1]
    assert e.reason_code == "reserved" and e.start_at == NOW + 2 * HOUR + 20 * 60
    assert e.reason == "needs 8 GPUs on one node; reserved on gpu-01 from 14:20 UTC"
    assert result.reservations[0].gpus_by_node == {"gpu-01": tuple(range(8))}


def test_a_job_behind_another_team_is_told_its_teams_usage_and_share():
    nodes, running = _busy_pool()
    pending = [PendingJob(1, "ml-ops", 8, 4.0, NOW - 60), PendingJob(2, "vision", 8, 4.0, NOW - 60)]
    result = plan(
        now=NOW,
        nodes=nodes,
        running=running,
        pending=pending,
        usage={"ml-ops": 320 * HOUR, "vision": 10 * HOUR},
        shares={"ml-ops": 1.0, "vision": 3.0},
    )
    assert result.estimates[2].reason_code == "reserved"
    e = result.estimates[1]
    assert e.reason_code == "fairshare"
    assert e.reason.startswith(
        "behind another team's job, that team having used less of its share (your team used 320 GPU-h"
    )
    assert "vision" not in e.reason
    assert "against a 25% share" in e.reason
    assert e.start_at is not None and e.start_at >= result.estimates[2].start_at


def test_no_reason_names_another_teams_job_or_team():
    """A waiting job's reason is shown to its team: the job ahead is named, and its size told, only when it is
    the team's own."""
    nodes, running = _busy_pool()
    pending = [
        PendingJob(1, "ml-ops", 8, 4.0, NOW - 600),
        PendingJob(2, "vision", 8, 4.0, NOW - 300),
        PendingJob(3, "ml-ops", 8, 4.0, NOW - 60),
    ]
    result = plan(now=NOW, nodes=nodes, running=running, pending=pending, usage={}, shares={})
    assert result.estimates[1].reason_code == "reserved"
    behind_other, behind_own = result.estimates[2].reason, result.estimates[3].reason
    assert "waiting behind another team's job;" in behind_other
    assert not re.search(r"\bjob 1\b", behind_other) and "ml-ops" not in behind_other
    assert "higher priority" not in behind_other  # nor how many GPUs that team asked for
    assert "waiting behind job 1 (higher priority, 8 GPUs)" in behind_own


def test_a_job_larger_than_the_pool_is_told_so_and_has_no_start():
    nodes, running = _busy_pool()
    result = plan(
        now=NOW, nodes=nodes, running=running, pending=[PendingJob(1, "a", 64, 1.0, NOW)], usage={}, shares={}
    )
    e = result.estimates[1]
    assert e.start_at is None and e.reason_code == "too_large"
    assert e.reason.startswith("larger than the pool can ever place")


def test_with_every_node_drained_nothing_starts_and_the_reason_says_why():
    nodes = [NodeView("gpu-01", 8, tuple(range(8)), schedulable=False)]
    result = plan(
        now=NOW, nodes=nodes, running=[], pending=[PendingJob(1, "a", 1, 1.0, NOW)], usage={}, shares={}
    )
    assert result.starts == [] and result.estimates[1].reason_code == "no_nodes"


def test_a_staging_job_does_not_start_and_is_estimated_after_its_data_arrives():
    nodes = [NodeView("gpu-01", 8, tuple(range(8)))]
    ready = NOW + HOUR + 5 * 60
    result = plan(
        now=NOW,
        nodes=nodes,
        running=[],
        pending=[PendingJob(1, "a", 2, 1.0, NOW, ready_at=ready)],
        usage={},
        shares={},
    )
    assert result.starts == []
    e = result.estimates[1]
    assert e.reason_code == "staging" and e.start_at >= ready
    assert "waiting for its data to finish staging (ETA 13:05 UTC)" in e.reason


def test_times_on_another_day_carry_the_date():
    assert format_utc(NOW + 26 * HOUR, now=NOW) == "14:00 UTC on 5 May"
    assert format_utc(NOW + HOUR, now=NOW) == "13:00 UTC"


@st.composite
def pools(draw):
    nodes, running = [], []
    for i in range(draw(st.integers(1, 4))):
        busy = draw(st.integers(0, 8))
        nodes.append(NodeView(f"n{i}", 8, tuple(range(busy, 8)), schedulable=draw(st.booleans()) or i == 0))
        if busy:
            end = NOW + draw(st.integers(-600, 20 * 3600))
            pre = draw(st.booleans())
            running.append(RunningView(1000 + i, "r", {f"n{i}": tuple(range(busy))}, NOW - 60, end, pre))
    pending = [
        PendingJob(
            job_id=j,
            team=draw(st.sampled_from(["a", "b", "c"])),
            gpus=(g := draw(st.integers(1, 40))),
            hours=draw(st.sampled_from([0.5, 1.0, 8.0])),
            submitted_at=NOW - draw(st.integers(0, 3 * 86400)),
            min_gpus=draw(st.one_of(st.none(), st.integers(1, g))),
            preemptible=draw(st.booleans()),
            ready_at=draw(st.one_of(st.none(), st.just(NOW + 1800))),
        )
        for j in range(draw(st.integers(0, 10)))
    ]
    return nodes, running, pending


@settings(max_examples=150, deadline=None)
@given(pools())
def test_every_pending_job_gets_an_estimate_and_decisions_do_not_depend_on_explaining(pool):
    nodes, running, pending = pool
    kwargs = dict(now=NOW, nodes=nodes, running=running, pending=pending, usage={"a": 5e5}, shares={})
    full = plan(**kwargs)
    quiet = plan(**kwargs, config=PolicyConfig(explain=False))
    assert set(full.estimates) == {j.job_id for j in pending}
    for e in full.estimates.values():
        assert e.reason and (e.start_at is not None or e.reason_code in ("too_large", "drained_capacity"))
        assert e.start_at is None or e.start_at >= NOW
    assert full.starts == quiet.starts
    assert full.preemptions == quiet.preemptions
    assert [(r.job_id, r.start_at) for r in full.reservations] == [
        (r.job_id, r.start_at) for r in quiet.reservations
    ]
    free = {(n.name, i) for n in nodes if n.schedulable for i in n.free}
    used = [(node, i) for s in full.starts for node, ix in s.gpus_by_node.items() for i in ix]
    assert len(used) == len(set(used)) and set(used) <= free


def test_a_job_that_fits_only_once_a_drain_ends_is_told_the_drain_is_temporary():
    nodes = [
        NodeView("gpu-01", 4, tuple(range(4))),
        NodeView("gpu-02", 4, tuple(range(4)), schedulable=False),
    ]
    result = plan(
        now=NOW, nodes=nodes, running=[], pending=[PendingJob(1, "a", 8, 1.0, NOW)], usage={}, shares={}
    )
    e = result.estimates[1]
    assert e.start_at is None and e.reason_code == "drained_capacity"
    assert "ever" not in e.reason and "larger than the pool" not in e.reason
    # Not only an operator's drain pauses a node (a silent agent, an upgrade, a full disk's hold): it says so.
    assert (
        "1 node is not taking jobs (drained or draining, silent, upgrading" in e.reason
        and "until it takes jobs again" in e.reason
    )
    assert len(e.reason) <= 300
    assert "4 GPUs on 1 node" in e.reason


def _format_from_datetimes(ts, now):
    """format_utc written the plain way: two datetimes, their dates compared."""
    when = datetime.fromtimestamp(ts, UTC)
    if now is not None and when.date() != datetime.fromtimestamp(now, UTC).date():
        return f"{when:%H:%M} UTC on {when.day} {when:%b}"
    return f"{when:%H:%M} UTC"


@settings(max_examples=500)
@given(
    now=st.floats(1.5e9, 2.2e9),
    ahead=st.one_of(st.floats(0, 4 * 86400), st.sampled_from([0.0, 59.999, 60.0, 86399.999, 86400.0])),
    with_now=st.booleans(),
)
def test_format_utc_agrees_with_formatting_each_datetime(now, ahead, with_now):
    # It formats once per UTC minute and day; midnight and minute edges included.
    ts, today = now + ahead, now if with_now else None
    assert format_utc(ts, now=today) == _format_from_datetimes(ts, today)
    midnight = (now // 86400 + 1) * 86400
    # Down to the last float before midnight, which datetime rounds up into the next day.
    for edge in (midnight - 0.001, math.nextafter(midnight, 0), midnight, midnight + 0.001):
        assert format_utc(edge, now=today) == _format_from_datetimes(edge, today)
        assert format_utc(ts, now=edge) == _format_from_datetimes(ts, edge)


def test_a_job_held_back_by_memory_is_told_when_memory_on_its_node_frees_not_when_any_job_ends():
    """gpu-01 (4 GPUs) has 3 idle GPUs but a 5-hour job holds 90 of its 100 GB; gpu-02 has only 2 GPUs
    and a job ending in 10 minutes. A 3-GPU job declaring 50 GB can start only when the 5-hour job on
    gpu-01 ends, but its team is told it starts in about 10 minutes: the estimate takes the first end of
    any running job in the pool, not of those on the nodes it waits for."""
    gb = 10**9
    nodes = [  # what the running jobs leave: 90 GB and a quarter of the CPUs; half of each (undeclared)
        NodeView("gpu-01", 4, (1, 2, 3), memory=100 * gb, cpus=32, free_memory=10 * gb, free_cpus=24),
        NodeView("gpu-02", 2, (1,), memory=100 * gb, cpus=32, free_memory=50 * gb, free_cpus=16),
    ]
    running = [
        RunningView(100, "ml-ops", {"gpu-01": (0,)}, NOW, NOW + 5 * HOUR),
        RunningView(101, "ml-ops", {"gpu-02": (0,)}, NOW, NOW + 10 * 60),
    ]
    waiting = PendingJob(1, "vision", 3, 1.0, NOW - 60, memory=50 * gb)
    result = plan(now=NOW, nodes=nodes, running=running, pending=[waiting], usage={}, shares={})
    e = result.estimates[1]
    assert result.starts == [] and e.reason_code == "no_room"
    assert e.start_at >= NOW + 5 * HOUR - 1, (e.start_at - NOW, e.reason)
