"""The reconciler re-drives what is stuck, and must neither hold what is stuck for ever nor overrule what moved:
a part whose node never takes its start is let go in time; a job it read as silent is released only if it still
is under the job's lock; and a spanning job whose started part failed ends failed, not lost, with its other,
never started part freed at once."""

from datetime import timedelta

import celery
import pytest
from django.utils import timezone

from jobs import dispatch, reconciler, rental, signals
from jobs.lifecycle import RETRIED, EndReason, State
from jobs.models import Allocation, GpuHold, Job, JobEvent, Node
from metering import services as metering
from metering.models import MeterEntry
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def _metered_s(allocation, **rows) -> float:
    return sum(e.microseconds for e in MeterEntry.objects.filter(allocation=allocation, **rows)) / 1e6


def test_a_part_whose_node_never_takes_its_start_is_freed_and_its_job_retried_without_spending_an_attempt(
    pool, team, settings
):
    """Without this, a 1-hour job placed on a node whose agent beats but never takes its start message (its
    consumer cut off from the broker, or its threads all taken by deliveries) stayed RENTED for days: its GPU
    held from everyone else and its team metered for every hour (47 GPU-hours over two days) although nothing of
    it ever ran; the reconciler only rang the start again, for ever, and the job's time limit runs from a start."""
    assert settings.E31_RECONCILE_AFTER_S == 60  # given up after 5 of them
    rented = timezone.now() - timedelta(hours=1)
    job = JobFactory(team=team, hours=1.0, requeue=True)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=rented)
    allocation = Allocation.objects.get(job=job)
    for waited in (timedelta(minutes=2), timedelta(minutes=4)):  # rung again; the node beats
        assert reconciler.reconcile(now=rented + waited).restarted == [allocation.id]
    gave_up = rented + timedelta(minutes=5, seconds=15)
    findings = reconciler.reconcile(now=gave_up)

    allocation.refresh_from_db()
    job.refresh_from_db()
    assert (allocation.released_at, allocation.end_reason) == (gave_up, "not_started")
    assert not GpuHold.objects.filter(allocation=allocation, active=True).exists()
    # Back to the queue, as a GPU still busy on its node sends it: none of its attempts spent.
    assert (job.state, job.lost_attempts, job.end_reason) == (State.QUEUED, 0, "")
    said = JobEvent.objects.filter(job=job, to_state=State.QUEUED).latest("at")
    assert said.reason.startswith(f"{RETRIED}: not started: gpu-01's agent took no start message in 300 s")
    # The node takes no new work for a while, so the job is not handed straight back to it.
    assert Node.objects.get(name="gpu-01").no_room_until == gave_up + timedelta(
        seconds=settings.E31_NO_ROOM_HOLD_S
    )
    metering.accrue_meter(now=timezone.now())
    assert (
        _metered_s(allocation, kind__in=("accrual", "final")) == (gave_up - rented).total_seconds()
    )  # not days
    assert _metered_s(allocation) == 0  # and nothing of it charged: the platform credited what never ran
    assert findings.restarted == [] and findings.unstarted_released == [allocation.id]
    # Its start message, taken at last, finds the part released: nothing runs.
    assert not rental.start_allocation(allocation_id=allocation.id, now=gave_up + timedelta(seconds=1))


def test_a_part_that_starts_as_the_reconciler_gives_up_on_it_is_not_released(pool, team):
    """The start and the give-up both take the job's row first: a start that wins keeps its part running (else its
    process would run on GPUs freed under it, and its job be queued twice)."""
    rented = timezone.now() - timedelta(minutes=10)
    job = JobFactory(team=team)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=rented)
    allocation = Allocation.objects.get(job=job)
    assert rental.start_allocation(allocation_id=allocation.id, now=rented + timedelta(minutes=6))
    assert not rental.release_unstarted(allocation_id=allocation.id, now=timezone.now(), detail="late")
    allocation.refresh_from_db()
    assert allocation.released_at is None
    assert Job.objects.get(id=job.id).state == State.RUNNING


def test_a_spanning_job_whose_other_part_never_starts_is_stopped_and_retried(pool, team):
    """Rank 0 runs, rank 1's node never takes its start: without this, rank 0 held its GPU (metered) waiting for a
    sibling that never came, for as long as the job's hours. Rank 1 is freed in time, rank 0 is told to stop, and
    once it has, the job goes back to the queue without spending an attempt."""
    rented = timezone.now() - timedelta(minutes=10)
    job = JobFactory(team=team, gpus=2, hours=4)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,), "gpu-02": (0,)}, now=rented)
    rank0, rank1 = Allocation.objects.filter(job=job).order_by("rank")
    assert rental.start_allocation(allocation_id=rank0.id, now=rented + timedelta(seconds=1))
    gave_up = rented + timedelta(minutes=5, seconds=15)
    rental.note_worker_alive(
        job_id=job.id, attempt=rank0.attempt, now=gave_up
    )  # rank 0's agent beats all along
    findings = reconciler.reconcile(now=gave_up)
    rank1.refresh_from_db()
    assert (rank1.released_at, rank1.end_reason) == (gave_up, "not_started")
    assert findings.unstarted_released == [rank1.id] and findings.abandoned == []
    assert rental.stop_reason(allocation_id=rank0.id, now=gave_up) == "sibling_failed"
    rank0.refresh_from_db()
    assert rank0.released_at is None  # its process runs until its agent stops it
    assert not rental.finish_allocation(
        allocation_id=rank0.id, exit_code=-15, outcome=rental.STOPPED, now=gave_up + timedelta(seconds=2)
    )
    job.refresh_from_db()
    assert (job.state, job.lost_attempts) == (State.QUEUED, 0)
    assert not GpuHold.objects.filter(allocation__job=job, active=True).exists()
    # Rank 1's held GPU is credited by the platform (it never ran); rank 0 ran the team's code, and is the team's.
    assert _metered_s(rank1) == 0 and _metered_s(rank1, kind__in=("accrual", "final")) == 315
    assert _metered_s(rank0) == _metered_s(rank0, kind__in=("accrual", "final")) == 317


def test_a_job_whose_agent_reports_its_exit_while_the_reconciler_works_is_not_released_as_lost(pool, team):
    """Without this, a job whose agent had gone quiet for a minute (a slow clean-up after its exit) and then
    reported a clean exit 0 while the reconciler was busy releasing another silent job was released too, as
    ``node_lost``, on what the reconciler had read before: the successful run discarded (its outputs never sealed
    or delivered), or run again from scratch."""
    started = timezone.now() - timedelta(minutes=10)
    jobs = []
    for node in ("gpu-01", "gpu-02"):
        job = JobFactory(team=team, hours=4, requeue=True)
        assert rental.rent_job(job_id=job.id, gpus_by_node={node: (0,)}, now=started)
        assert rental.start_allocation(allocation_id=Allocation.objects.get(job=job).id, now=started)
        Job.objects.filter(id=job.id).update(worker_seen_at=timezone.now() - timedelta(minutes=5))
        jobs.append(job)
    reported: list[int] = []

    def the_other_agent_reports_its_exit(sender, *, allocation_id, **_):
        if reported:
            return
        released = Allocation.objects.get(id=allocation_id).job_id
        other = next(j for j in jobs if j.id != released)
        part = Allocation.objects.get(job=other)
        assert rental.finish_allocation(
            allocation_id=part.id, exit_code=0, outcome=EndReason.SUCCEEDED, now=timezone.now()
        )
        rental.note_worker_alive(job_id=other.id, attempt=part.attempt, now=timezone.now())
        reported.append(other.id)

    signals.allocation_released.connect(the_other_agent_reports_its_exit, dispatch_uid="reconciler-race")
    try:
        findings = reconciler.reconcile(now=timezone.now())
    finally:
        signals.allocation_released.disconnect(dispatch_uid="reconciler-race")

    assert reported, "no release happened: the race was not exercised"
    lost = next(j.id for j in jobs if j.id != reported[0])
    assert findings.abandoned == [lost]
    survivor = Job.objects.get(id=reported[0])
    assert (survivor.state, survivor.end_reason, survivor.lost_attempts) == (State.OUTPUT, "", 0)
    assert Allocation.objects.get(job=survivor).released_at is None  # sealing next, then released succeeded


def test_a_spanning_job_whose_started_part_failed_ends_failed_with_its_exit_code_not_lost(
    pool, team, monkeypatch
):
    """Without this, a 2-node job whose rank 0 exited 3 at once (a bug in the team's code) while rank 1's start
    was still queued on its node kept rank 0's GPU held (metered) with nothing running, until the reconciler took
    the quiet job for a lost node: reported ``node_lost`` instead of ``failed`` with exit code 3, and, as it
    allowed requeue, run again from scratch (up to E31_MAX_ATTEMPTS times), each time the same way."""
    asked: list[int] = []
    monkeypatch.setattr(
        dispatch, "deliver_part", lambda allocation_id, node, **_: asked.append(allocation_id)
    )
    t0 = timezone.now() - timedelta(minutes=5)
    job = JobFactory(team=team, gpus=2, requeue=True, hours=4, worker_seen_at=t0, output_bytes=100)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,), "gpu-02": (0,)}, now=t0)
    rank0, rank1 = Allocation.objects.filter(job=job).order_by("rank")
    assert rental.start_allocation(allocation_id=rank0.id, now=t0 + timedelta(seconds=1))
    rental.note_worker_alive(job_id=job.id, attempt=rank0.attempt, now=t0 + timedelta(seconds=1))
    failed_at = t0 + timedelta(seconds=3)
    assert rental.finish_allocation(
        allocation_id=rank0.id, exit_code=3, outcome=EndReason.FAILED, now=failed_at
    )
    # rank 1's start is still queued on gpu-02: it never will run, and its GPU is freed at once
    rank1.refresh_from_db()
    assert (rank1.started_at, rank1.released_at, rank1.end_reason) == (None, failed_at, "stopped")
    assert not GpuHold.objects.filter(allocation=rank1, active=True).exists()
    # rank 0's agent seals what it wrote before failing
    manifest = [{"path": "rank0/crash.txt", "bytes": 10, "sha256": "0" * 64}]
    rental.seal_allocation(allocation_id=rank0.id, manifest=manifest, now=failed_at + timedelta(seconds=1))
    reconciler.reconcile(now=t0 + timedelta(seconds=90))

    job.refresh_from_db()
    assert (job.state, job.end_reason, job.exit_code, job.lost_attempts) == (
        State.RELEASED, EndReason.FAILED, 3, 0,
    )  # fmt: skip
    # What rank 0 wrote is delivered as any failed run's is; rank 1's node, which wrote nothing, is not asked.
    assert (job.delivery_state, set(asked)) == ("delivering", {rank0.id})
    rank1.refresh_from_db()
    assert rank1.delivered_at is not None
    assert not rental.start_allocation(allocation_id=rank1.id, now=t0 + timedelta(seconds=91))


def test_a_job_waiting_for_its_other_parts_start_is_not_taken_for_silent(pool, team):
    """Rank 0 exited 0 and sealed, its agent quiet since; rank 1's start message was lost and is rung again.
    Without this the reconciler took the quiet for a lost agent after a minute and released the job as
    ``node_lost`` (requeued, spending an attempt) although rank 1's node beats and may yet take its start."""
    t0 = timezone.now() - timedelta(minutes=5)
    job = JobFactory(team=team, gpus=2, requeue=True, hours=4)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,), "gpu-02": (0,)}, now=t0)
    rank0, rank1 = Allocation.objects.filter(job=job).order_by("rank")
    assert rental.start_allocation(allocation_id=rank0.id, now=t0 + timedelta(seconds=1))
    rental.note_worker_alive(job_id=job.id, attempt=rank0.attempt, now=t0 + timedelta(seconds=5))
    assert rental.finish_allocation(
        allocation_id=rank0.id, exit_code=0, outcome=EndReason.SUCCEEDED, now=t0 + timedelta(seconds=5)
    )
    rental.seal_allocation(allocation_id=rank0.id, manifest=[], now=t0 + timedelta(seconds=5))
    findings = reconciler.reconcile(now=t0 + timedelta(seconds=90))
    assert (findings.abandoned, findings.restarted) == ([], [rank1.id])
    job.refresh_from_db()
    assert (job.state, job.lost_attempts) == (State.RUNNING, 0)
    # rank 1 starts at last; both parts end, and the job succeeds
    assert rental.start_allocation(allocation_id=rank1.id, now=t0 + timedelta(seconds=95))
    assert rental.finish_allocation(
        allocation_id=rank1.id, exit_code=0, outcome=EndReason.SUCCEEDED, now=t0 + timedelta(seconds=99)
    )
    rental.seal_allocation(allocation_id=rank1.id, manifest=[], now=t0 + timedelta(seconds=99))
    job.refresh_from_db()
    assert (job.state, job.end_reason, job.exit_code) == (State.RELEASED, EndReason.SUCCEEDED, 0)


def test_a_step_of_the_reconciler_that_fails_does_not_keep_the_others_from_running(monkeypatch, caplog):
    """A job it cannot restage (a bad row, a broken source) stopped every later step of every run: no stuck start
    re-sent, no silent job released, no delivery re-driven, no pass asked for."""
    ran = []

    def broken(*args, **kwargs):
        raise RuntimeError("a row this step cannot handle")

    monkeypatch.setattr(reconciler, "_restage", broken)
    monkeypatch.setattr(reconciler, "_redeliver", lambda *args: ran.append("redeliver"))
    monkeypatch.setattr(reconciler.dispatch, "request_scheduler_pass", lambda: ran.append("pass"))
    reconciler.reconcile(now=timezone.now())
    assert ran == ["redeliver", "pass"]
    assert "a row this step cannot handle" in caplog.text


def test_what_the_reconciler_rings_again_expires_and_skips_nodes_that_are_down(
    pool, team, monkeypatch, django_capture_on_commit_callbacks, settings
):
    """Reproduction: with the stager down, three stuck jobs and an hour of reconciler runs left 717 stage_job
    messages on its queue (4 a minute a job, none ever dropped), and deliveries were rung again for a day to a
    node that was down. A repeated stage_job now expires once the next one is due; none is rung for a node down
    for silence. A node's own messages carry no expiry (its clock need not keep time), and a node an operator
    holds down still beats, so its deliveries are rung."""
    sent: list[tuple[str, dict]] = []
    monkeypatch.setattr(celery.current_app, "send_task", lambda name, **options: sent.append((name, options)))
    now = timezone.now()
    long_ago = now - timedelta(hours=1)
    stuck = JobFactory(team=team, state=State.SUBMITTED, state_changed_at=long_ago)
    silent, held = pool
    Node.objects.filter(id=silent.id).update(state=Node.NodeState.DOWN)
    Node.objects.filter(id=held.id).update(state=Node.NodeState.DOWN, held_down_by="olga")
    parts = {}
    for node in pool:
        job = JobFactory(team=team, state=State.RELEASED, attempt=1, delivery_state="delivering")
        parts[node.name] = Allocation.objects.create(
            job=job, attempt=1, node=node, gpu_indices=[0], rented_at=long_ago, started_at=long_ago,
            released_at=long_ago,
        )  # fmt: skip

    with django_capture_on_commit_callbacks(execute=True):
        reconciler.reconcile(now=now)

    [staged] = [options for name, options in sent if name == dispatch.STAGE_JOB]
    assert staged["args"] == (stuck.id,) and 0 < staged["expires"] <= 2 * settings.E31_RECONCILE_EVERY_S
    [delivered] = [options for name, options in sent if name == dispatch.DELIVER_PART]
    assert delivered["args"] == (parts[held.name].id,) and "expires" not in delivered
