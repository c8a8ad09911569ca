"""A waiting job's estimate is never sooner than the pass would start it, and its reason says what really keeps
it waiting and tells its team nothing of another team's job."""

from datetime import UTC, datetime

from jobs.scheduling.policy import plan
from jobs.scheduling.types import NodeView, PendingJob, PolicyConfig, RunningView

NOW = datetime(2026, 5, 4, 12, 0, tzinfo=UTC).timestamp()
HOUR = 3600.0
GB = 1e9


def _plan(pending, running=(), nodes=()):
    return plan(now=NOW, nodes=list(nodes), running=list(running), pending=pending, usage={}, shares={})


def _told(e):
    return f"told {datetime.fromtimestamp(e.start_at, UTC):%H:%M}: {e.reason}"


# ----- memory and CPUs


def test_a_job_held_back_by_memory_is_not_told_it_starts_now():
    """gpu-01 has 100 GB; job 100 holds 90 GB of it until 15:00. Jobs 1 and 2 each need 50 GB: neither can
    start before 15:00, the reserved one nor the one behind it."""
    nodes = [
        NodeView("gpu-01", 8, tuple(range(2, 8)), memory=100 * GB, cpus=64, free_memory=10 * GB, free_cpus=60)
    ]
    running = [RunningView(100, "audio", {"gpu-01": (0, 1)}, NOW - HOUR, NOW + 3 * HOUR)]
    pending = [
        PendingJob(1, "vision", 1, 1.0, NOW - 120, memory=50 * GB),
        PendingJob(2, "vision", 1, 1.0, NOW - 60, memory=50 * GB),
    ]
    result = _plan(pending, running, nodes)
    assert result.starts == []
    assert result.estimates[1].start_at == NOW + 3 * HOUR
    e = result.estimates[2]
    assert e.reason_code == "no_room" and e.start_at >= NOW + 3 * HOUR, _told(e)


def test_a_job_held_back_by_memory_no_running_job_will_free_is_not_given_a_time():
    """Memory short on the only node, and no job running there to end (what holds it is being released): the
    job is told what it waits for, and no time, rather than a start now that will not happen."""
    nodes = [
        NodeView("gpu-01", 8, tuple(range(8)), memory=100 * GB, cpus=64, free_memory=10 * GB, free_cpus=64)
    ]
    pending = [PendingJob(1, "vision", 1, 1.0, NOW - 120, memory=50 * GB)]
    e = _plan(pending, (), nodes).estimates[1]
    assert e.reason_code == "no_room" and e.start_at is None
    assert "no job running on a node that could hold it is due to end" in e.reason


def test_memory_a_start_of_the_same_pass_takes_frees_when_that_start_ends():
    """Job 1 starts now with 60 of gpu-01's 100 GB for two hours: job 2 (50 GB) waits for its end, not for
    nothing at all."""
    nodes = [
        NodeView("gpu-01", 8, tuple(range(8)), memory=100 * GB, cpus=64, free_memory=100 * GB, free_cpus=64)
    ]
    pending = [
        PendingJob(1, "vision", 1, 2.0, NOW - 120, memory=60 * GB),
        PendingJob(2, "vision", 1, 2.0, NOW - 60, memory=50 * GB),
    ]
    result = _plan(pending, (), nodes)
    assert [s.job_id for s in result.starts] == [1]
    e = result.estimates[2]
    assert e.reason_code == "no_room" and e.start_at == NOW + 2 * HOUR, e


# ----- idle GPUs spread over nodes


def test_a_job_behind_a_reservation_is_not_told_it_starts_now_on_idle_gpus_no_node_has_together():
    """gpu-01 is busy until 22:00; gpu-02..05 have 4 of 8 GPUs idle each until 08:00 tomorrow: 16 idle GPUs, but
    no node with 8. Job 1 (8 GPUs, an hour) is reserved on gpu-01 from 22:00; job 2 (8 GPUs too) cannot start
    before job 1 has ended there, at 23:00. Counted pool-wide, it was told it would start about now."""
    nodes = [NodeView("gpu-01", 8, ())] + [NodeView(f"gpu-0{i}", 8, tuple(range(4, 8))) for i in range(2, 6)]
    running = [RunningView(100, "audio", {"gpu-01": tuple(range(8))}, NOW - HOUR, NOW + 10 * HOUR)] + [
        RunningView(100 + i, "audio", {f"gpu-0{i}": tuple(range(4))}, NOW - HOUR, NOW + 20 * HOUR)
        for i in range(2, 6)
    ]
    pending = [
        PendingJob(1, "vision", 8, 1.0, NOW - 120),
        PendingJob(2, "vision", 8, 1.0, NOW - 60),
    ]
    result = _plan(pending, running, nodes)
    assert result.starts == []
    assert result.estimates[1].start_at == NOW + 10 * HOUR
    e = result.estimates[2]
    assert e.start_at == NOW + 11 * HOUR, _told(e)
    assert "idle together" in e.reason, e.reason


def test_a_job_spanning_nodes_waits_for_whole_nodes_not_for_as_many_idle_gpus_anywhere():
    """gpu-01 and gpu-02 are busy until 22:00; eight more nodes have 4 of 8 GPUs idle each, for a day: 32 idle
    GPUs, no whole node. Job 1 (16 GPUs) is reserved on gpu-01 and gpu-02 from 22:00; job 2 (16 GPUs) takes
    two whole nodes, so it starts when job 1 ends, at 23:00."""
    names = [f"gpu-{i:02}" for i in range(1, 11)]
    nodes = [NodeView(n, 8, () if i < 2 else tuple(range(4, 8))) for i, n in enumerate(names)]
    running = [
        RunningView(100 + i, "audio", {n: tuple(range(8 if i < 2 else 4))}, NOW - HOUR,
                    NOW + (10 if i < 2 else 24) * HOUR)
        for i, n in enumerate(names)
    ]  # fmt: skip
    pending = [
        PendingJob(1, "vision", 16, 1.0, NOW - 120),
        PendingJob(2, "vision", 16, 1.0, NOW - 60),
    ]
    result = _plan(pending, running, nodes)
    assert result.estimates[1].start_at == NOW + 10 * HOUR
    e = result.estimates[2]
    assert e.start_at == NOW + 11 * HOUR, _told(e)


def test_gpus_a_preempted_backlog_job_leaves_to_no_hold_are_not_counted_busy_until_its_end():
    """A backlog job holds gpu-01's 8 GPUs for 100 hours. Job 1 (4 GPUs) is reserved now and preempts it; job 2
    (4 GPUs) takes the other four at the next pass, not when the preempted job would have ended."""
    nodes = [NodeView("gpu-01", 8, ())]
    running = [
        RunningView(100, "audio", {"gpu-01": tuple(range(8))}, NOW - HOUR, NOW + 100 * HOUR, preemptible=True)
    ]
    pending = [PendingJob(1, "vision", 4, 1.0, NOW - 600), PendingJob(2, "vision", 4, 1.0, NOW - 300)]
    result = _plan(pending, running, nodes)
    assert result.preemptions == [100]
    assert result.estimates[2].start_at == NOW, _told(result.estimates[2])


def test_a_backlog_job_another_job_may_not_preempt_is_waited_for():
    """gpu-01 (4 GPUs) runs a backlog job until 17:00. Job 1 (8 GPUs) is reserved on gpu-02 from 14:00, which it
    cannot leave to preempt: it holds the pass's one reservation. Job 2 (1 GPU, 10 h) may not preempt the backlog
    job (only a reservation does) nor delay job 1: it starts at 17:00, not now."""
    nodes = [NodeView("gpu-01", 4, ()), NodeView("gpu-02", 8, ())]
    running = [
        RunningView(100, "audio", {"gpu-01": tuple(range(4))}, NOW - HOUR, NOW + 5 * HOUR, preemptible=True),
        RunningView(101, "audio", {"gpu-02": tuple(range(8))}, NOW - HOUR, NOW + 2 * HOUR),
    ]
    pending = [PendingJob(1, "vision", 8, 4.0, NOW - 600), PendingJob(2, "vision", 1, 10.0, NOW - 300)]
    result = _plan(pending, running, nodes)
    assert result.preemptions == [] and result.estimates[1].start_at == NOW + 2 * HOUR
    assert result.estimates[2].start_at == NOW + 5 * HOUR, _told(result.estimates[2])


def test_a_job_past_its_expected_end_frees_its_gpus_for_the_estimates_as_for_the_pass():
    """Job 100 on gpu-01 was expected to end at 11:50 and still runs; gpu-02 is busy until 08:00 tomorrow. The pass
    reserves gpu-01 for job 1 from 12:00; job 2 follows it there at 13:00, not when gpu-02 frees."""
    nodes = [NodeView("gpu-01", 8, ()), NodeView("gpu-02", 8, ())]
    running = [
        RunningView(100, "audio", {"gpu-01": tuple(range(8))}, NOW - 5 * HOUR, NOW - 600),
        RunningView(101, "audio", {"gpu-02": tuple(range(8))}, NOW - HOUR, NOW + 20 * HOUR),
    ]
    pending = [PendingJob(1, "vision", 8, 1.0, NOW - 900), PendingJob(2, "vision", 8, 1.0, NOW - 600)]
    result = _plan(pending, running, nodes)
    assert result.estimates[1].start_at == NOW
    assert result.estimates[2].start_at == NOW + HOUR, _told(result.estimates[2])


def test_an_elastic_job_wider_than_a_node_is_not_told_it_starts_on_its_minimum_spread_over_nodes():
    """gpu-01 is idle, gpu-02 has 2 GPUs idle, gpu-03 is busy until 13:00. Job 1 (16 GPUs) is reserved on gpu-01 and
    gpu-03 from 13:00. Elastic job 2 asks for 12 GPUs (an hour), at least 10: 10 are idle now, but the pass starts a
    job wider than a node smaller only on whole nodes (16 here is more than it asks), so at 12 - at 14:00, after
    job 1."""
    nodes = [NodeView("gpu-01", 8, tuple(range(8))), NodeView("gpu-02", 8, (6, 7)), NodeView("gpu-03", 8, ())]
    running = [
        RunningView(100, "audio", {"gpu-02": tuple(range(6))}, NOW - HOUR, NOW + 10 * HOUR),
        RunningView(101, "audio", {"gpu-03": tuple(range(8))}, NOW - HOUR, NOW + HOUR),
    ]
    pending = [
        PendingJob(1, "vision", 16, 1.0, NOW - 900),
        PendingJob(2, "vision", 12, 1.0, NOW - 600, min_gpus=10),
    ]
    result = _plan(pending, running, nodes)
    assert result.starts == [] and result.estimates[1].start_at == NOW + HOUR
    assert result.estimates[2].start_at == NOW + 2 * HOUR, _told(result.estimates[2])


# ----- backfilling


def test_a_short_job_is_told_the_gap_it_backfills_not_the_end_of_all_the_work_ranked_ahead():
    """gpu-01 frees at 14:00, gpu-02 at 16:00. Job 1 (16 GPUs, 10 h) is reserved on both from 16:00; job 2 (8 GPUs,
    20 h) can only follow it, at 02:00. Job 3 (4 GPUs, an hour) ends before 16:00 if it starts at 14:00 on gpu-01,
    so the pass backfills it then. Counting the 160 GPU-hours of job 2 ahead of it as if nothing backfilled, it was
    told 12:00 tomorrow."""
    nodes = [NodeView("gpu-01", 8, ()), NodeView("gpu-02", 8, ())]
    running = [
        RunningView(100, "audio", {"gpu-01": tuple(range(8))}, NOW - HOUR, NOW + 2 * HOUR),
        RunningView(101, "audio", {"gpu-02": tuple(range(8))}, NOW - HOUR, NOW + 4 * HOUR),
    ]
    pending = [
        PendingJob(1, "vision", 16, 10.0, NOW - 48 * HOUR),
        PendingJob(2, "vision", 8, 20.0, NOW - 48 * HOUR + 60),
        PendingJob(3, "vision", 4, 1.0, NOW - 60),
    ]
    result = _plan(pending, running, nodes)
    assert result.estimates[1].start_at == NOW + 4 * HOUR
    assert result.estimates[2].start_at == NOW + 14 * HOUR, _told(result.estimates[2])
    assert result.estimates[3].start_at == NOW + 2 * HOUR, _told(result.estimates[3])
    # It starts before job 1, so job 1 is not what it waits behind: it waits for GPUs to free.
    assert result.estimates[3].reason_code == "no_gpus", _told(result.estimates[3])
    assert "behind" not in result.estimates[3].reason
    assert "waiting behind job 1" in result.estimates[2].reason
    later = plan(now=NOW + 2 * HOUR, nodes=[NodeView("gpu-01", 8, tuple(range(8))), nodes[1]],
                 running=running[1:], pending=pending, usage={}, shares={})  # fmt: skip
    assert [s.job_id for s in later.starts] == [3]  # the pass does start it then


# ----- backlog jobs


def test_a_backlog_job_is_not_promised_gpus_a_non_backlog_job_will_take_first():
    """One 8-GPU node busy until 13:00. Backlog job 1 (oldest) and jobs 2 and 3 (not preemptible) each need 8
    GPUs for an hour. Backlog jobs run only on GPUs nobody else wants: 2 runs 13-14, 3 runs 14-15, so job 1
    cannot start before 15:00."""
    nodes = [NodeView("gpu-01", 8, ())]
    running = [RunningView(100, "audio", {"gpu-01": tuple(range(8))}, NOW - HOUR, NOW + HOUR)]
    pending = [
        PendingJob(1, "vision", 8, 1.0, NOW - 3 * 60, preemptible=True),
        PendingJob(2, "vision", 8, 1.0, NOW - 2 * 60),
        PendingJob(3, "vision", 8, 1.0, NOW - 1 * 60),
    ]
    result = _plan(pending, running, nodes)
    assert result.estimates[2].start_at == NOW + HOUR
    assert result.estimates[3].start_at >= NOW + 2 * HOUR
    e = result.estimates[1]
    assert e.reason_code == "backlog" and e.start_at >= NOW + 3 * HOUR, _told(e)


def test_a_backlog_job_does_not_push_back_the_jobs_behind_it():
    """Backlog job 2 is ahead of job 3 in priority order, but yields to it: job 3 is estimated as if job 2 were
    not there, behind job 1 only."""
    nodes = [NodeView("gpu-01", 8, ())]
    running = [RunningView(100, "audio", {"gpu-01": tuple(range(8))}, NOW - HOUR, NOW + HOUR)]
    first, last = PendingJob(1, "vision", 8, 1.0, NOW - 900), PendingJob(3, "vision", 8, 1.0, NOW - 60)
    alone = _plan([first, last], running, nodes).estimates[3]
    backlog = PendingJob(2, "vision", 8, 1.0, NOW - 600, preemptible=True)
    e = _plan([first, backlog, last], running, nodes).estimates[3]
    assert e.start_at == alone.start_at == NOW + 2 * HOUR, _told(e)
    assert "waiting behind job 1" in e.reason, e.reason


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


# ----- elastic jobs


def _elastic_pool(second_end):
    nodes = [NodeView("gpu-01", 8, ())]
    running = [
        RunningView(100, "audio", {"gpu-01": (0, 1, 2, 3)}, NOW - HOUR, NOW + HOUR),
        RunningView(101, "audio", {"gpu-01": (4, 5, 6, 7)}, NOW - HOUR, second_end),
    ]
    return nodes, running


def test_an_elastic_job_is_not_told_it_waits_for_its_full_size_when_its_minimum_frees_first():
    """Elastic job 1 asks for 8 GPUs, at least 4. Four GPUs free at 13:00, the other four at 17:00: the next pass
    after 13:00 starts it on 4 (policy rule 5), though its reservation is for 8 from 17:00."""
    nodes, running = _elastic_pool(NOW + 5 * HOUR)
    job = PendingJob(1, "vision", 8, 2.0, NOW - 60, min_gpus=4)
    e = _plan([job], running, nodes).estimates[1]
    later = _plan([job], [running[1]], [NodeView("gpu-01", 8, (0, 1, 2, 3))])
    assert [s.job_id for s in later.starts] == [1]  # what really happens at 13:00
    assert e.start_at == NOW + HOUR, _told(e)
    assert e.reason_code == "elastic" and "elastic, at least 4" in e.reason and "17:00 UTC" in e.reason, (
        e.reason
    )


def test_an_elastic_job_whose_minimum_frees_with_the_rest_keeps_its_reservation_time():
    nodes, running = _elastic_pool(NOW + HOUR)
    e = _plan([PendingJob(1, "vision", 8, 2.0, NOW - 60, min_gpus=4)], running, nodes).estimates[1]
    assert (e.reason_code, e.start_at) == ("reserved", NOW + HOUR), e


def test_an_elastic_job_is_not_told_its_minimum_frees_before_a_reservation_ahead_of_it_is_done():
    """Four GPUs of gpu-01 free at 12:30, the other four at 13:00. Job 1 (not elastic) is reserved all 8 from 13:00
    to 15:00, and elastic job 2 (8, at least 4) all 8 from 15:00: it cannot start on the 4 freed at 12:30 (job 1
    would be late), and is told 15:00."""
    nodes, running = _elastic_pool(NOW + HOUR)
    running = [running[0], RunningView(101, "audio", {"gpu-01": (4, 5, 6, 7)}, NOW - HOUR, NOW + 30 * 60)]
    pending = [
        PendingJob(1, "audio", 8, 2.0, NOW - 600),
        PendingJob(2, "vision", 8, 2.0, NOW - 60, min_gpus=4),
    ]
    two = PolicyConfig(reserve_top=2, max_reservations=2)
    result = plan(now=NOW, nodes=nodes, running=running, pending=pending, usage={}, shares={}, config=two)
    assert [(r.job_id, r.start_at) for r in result.reservations] == [(1, NOW + HOUR), (2, NOW + 3 * HOUR)]
    e = result.estimates[2]
    assert (e.reason_code, e.start_at) == ("reserved", NOW + 3 * HOUR), _told(e)


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
