"""What a RELEASE must never do, whoever calls it: requeue a job its team asked to cancel, end an attempt
that replaced the one its caller saw, or free the GPU of a part of a job spanning nodes while that part's
process still runs."""

import hashlib
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from jobs import agent, nodes, reconciler, rental, services
from jobs.lifecycle import PREEMPTED, REQUEUED, EndReason, State
from jobs.models import Allocation, GpuHold, Job
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db
SHA256 = hashlib.sha256  # the real one, before a test slows the agent's down


def _running(job, *, node="gpu-01", at):
    assert rental.rent_job(job_id=job.id, gpus_by_node={node: (0,)}, now=at)
    allocation = Allocation.objects.get(job=job, released_at__isnull=True)
    assert rental.start_allocation(allocation_id=allocation.id, now=at)
    return allocation


def _assert_cancelled(job):
    job.refresh_from_db()
    assert (job.state, job.end_reason, job.attempt) == (State.RELEASED, EndReason.CANCELLED, 1)
    assert job.end_detail.startswith("cancelled as requested; the attempt had ended: ")
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_cancel_requested_before_its_node_is_lost_ends_the_job(pool, team, member):
    job = JobFactory(team=team, requeue=True)
    now = timezone.now()
    _running(job, at=now)
    assert services.cancel_job(job_id=job.id, user=member, now=now + timedelta(seconds=1))
    nodes.set_node_state(name="gpu-01", target="down", now=now + timedelta(seconds=2), actor="olga")
    _assert_cancelled(job)


def test_a_cancel_requested_before_the_reconciler_gives_up_on_its_agent_ends_the_job(pool, team, member):
    job = JobFactory(team=team, requeue=True)
    then = timezone.now() - timedelta(hours=1)
    _running(job, at=then)
    Job.objects.filter(id=job.id).update(worker_seen_at=then)
    assert services.cancel_job(job_id=job.id, user=member, now=then + timedelta(seconds=1))
    reconciler.reconcile(now=timezone.now())
    _assert_cancelled(job)


def test_a_cancel_during_a_preemptions_grace_ends_the_job(pool, team, member):
    job = JobFactory(team=team, preemptible=True)
    now = timezone.now()
    allocation = _running(job, at=now)
    assert rental.request_preemption(job_id=job.id, now=now + timedelta(seconds=1))
    # The agent sees the preemption and stops the process.
    assert rental.stop_reason(allocation_id=allocation.id, now=now) == PREEMPTED
    assert services.cancel_job(job_id=job.id, user=member, now=now + timedelta(seconds=2))
    part = SimpleNamespace(job=job, allocation=allocation, rank=0, num_nodes=1)
    agent._after_exit(part, None, PREEMPTED, -15)  # the agent, once the process stopped
    _assert_cancelled(job)


def test_an_agent_of_a_replaced_attempt_does_not_release_the_attempt_after_it(pool):
    job = JobFactory(preemptible=True, requeue=True)
    now = timezone.now()
    first = _running(job, at=now)
    assert rental.request_preemption(job_id=job.id, now=now + timedelta(seconds=1))
    assert rental.stop_reason(allocation_id=first.id, now=now) == PREEMPTED  # gpu-01's agent starts the grace
    # Meanwhile gpu-01 is declared down (attempt 1 released, the job requeued) and attempt 2 starts on gpu-02.
    nodes.set_node_state(name="gpu-01", target="down", now=now + timedelta(seconds=2), actor="olga")
    second = _running(job, node="gpu-02", at=now + timedelta(seconds=3))
    # gpu-01's agent, its process stopped at last, reports attempt 1's preemption.
    part = SimpleNamespace(
        job=SimpleNamespace(id=job.id, checkpoints=False), allocation=first, rank=0, num_nodes=1
    )
    agent._after_exit(part, None, PREEMPTED, -15)
    second.refresh_from_db()
    job.refresh_from_db()
    assert second.released_at is None
    assert (job.state, job.attempt) == (State.RUNNING, 2)


class _SlowHash:
    """sha256 whose every 1 MiB block takes 20 s of the agent's (fake) clock; the reconciler runs once the seal
    has taken 100 s, as it would while a node hashes a large output."""

    def __init__(self, clock, reconcile_at):
        self._digest, self._clock, self._reconcile_at = SHA256(), clock, reconcile_at

    def update(self, block):
        self._digest.update(block)
        self._clock.elapsed += 20
        if self._clock.elapsed >= 100 and not self._clock.reconciled:
            self._clock.reconciled = True
            reconciler.reconcile(now=self._reconcile_at())

    def hexdigest(self):
        return self._digest.hexdigest()


def test_a_run_that_succeeded_is_not_taken_for_lost_while_its_agent_seals_a_large_output(
    pool, settings, tmp_path, monkeypatch
):
    assert settings.E31_RECONCILE_AFTER_S == 60
    job = JobFactory(output_bytes=2**40)
    began = timezone.now() - timedelta(minutes=10)
    allocation = _running(job, at=began)
    exited = began + timedelta(seconds=62)
    rental.note_worker_alive(
        job_id=job.id, attempt=allocation.attempt, now=exited - timedelta(seconds=2)
    )  # the run's last beat
    clock = SimpleNamespace(elapsed=0.0, reconciled=False)
    at = lambda: exited + timedelta(seconds=clock.elapsed)  # noqa: E731
    monkeypatch.setattr(agent.time, "monotonic", lambda: clock.elapsed)
    monkeypatch.setattr(agent.clock, "now", at)  # the agent dates its reports with it
    monkeypatch.setattr(agent.hashlib, "sha256", lambda: _SlowHash(clock, at))
    output = tmp_path / "output"
    output.mkdir()
    (output / "weights.bin").write_bytes(b"w" * (8 << 20))  # 8 blocks: 160 s of hashing
    part = SimpleNamespace(job=job, allocation=allocation, rank=0, num_nodes=1)
    agent._after_exit(part, SimpleNamespace(output=output), EndReason.SUCCEEDED, 0)
    job.refresh_from_db()
    assert clock.reconciled
    assert (job.state, job.end_reason, job.sealed_files) == (State.RELEASED, EndReason.SUCCEEDED, 1)


def _spanning(job, *, at):
    """Rents gpu-01:0 and gpu-02:0 for ``job`` and starts both parts; returns (rank 0, rank 1)."""
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,), "gpu-02": (0,)}, now=at)
    parts = list(Allocation.objects.filter(job=job).order_by("rank"))
    for part in parts:
        assert rental.start_allocation(allocation_id=part.id, now=at)
    return parts


def _part(allocation):
    allocation.refresh_from_db()
    return SimpleNamespace(job=Job.objects.get(id=allocation.job_id), allocation=allocation, rank=allocation.rank,
                           num_nodes=2)  # fmt: skip


def _holds(allocation) -> bool:
    return GpuHold.objects.filter(allocation=allocation, active=True).exists()


def test_a_preempted_spanning_job_is_requeued_only_once_its_last_part_stopped(pool, team):
    """Rank 1 stops at once; rank 0 is still in its grace, writing its checkpoint: the job must not be rented again
    (on rank 0's GPU too) before rank 0 stopped, or the next attempt would not find that checkpoint."""
    job = JobFactory(team=team, gpus=2, preemptible=True, requeue=True)
    now = timezone.now()
    rank0, rank1 = _spanning(job, at=now)
    assert rental.request_preemption(job_id=job.id, now=now + timedelta(seconds=1))
    assert rental.stop_reason(allocation_id=rank0.id, now=now) == PREEMPTED
    agent._after_exit(_part(rank1), None, PREEMPTED, -10)

    job.refresh_from_db()
    assert job.state == State.RUNNING and _holds(rank0) and not _holds(rank1)
    again = {"gpu-01": (0,), "gpu-02": (1,)}
    assert not rental.rent_job(job_id=job.id, gpus_by_node=again, now=now + timedelta(seconds=3))

    agent._after_exit(_part(rank0), None, PREEMPTED, -10)
    job.refresh_from_db()
    assert (job.state, job.attempt) == (State.QUEUED, 1) and not _holds(rank0)
    assert rental.rent_job(job_id=job.id, gpus_by_node=again, now=now + timedelta(seconds=4))


def test_a_cancelled_spanning_job_keeps_a_parts_gpu_until_that_part_stopped(pool, team, other_team, member):
    """Rank 0 dies at TERM, rank 1 takes its kill grace: its GPU stays held, and metered, until it is gone."""
    job = JobFactory(team=team, gpus=2)
    now = timezone.now()
    rank0, rank1 = _spanning(job, at=now)
    assert services.cancel_job(job_id=job.id, user=member, now=now + timedelta(seconds=1))
    agent._after_exit(_part(rank0), None, EndReason.CANCELLED, -15)

    assert _holds(rank1) and not _holds(rank0)
    stranger = JobFactory(team=other_team, gpus=1)
    assert not rental.rent_job(
        job_id=stranger.id, gpus_by_node={"gpu-02": (0,)}, now=now + timedelta(seconds=2)
    )

    agent._after_exit(_part(rank1), None, EndReason.CANCELLED, -9)
    job.refresh_from_db()
    rank0.refresh_from_db()
    rank1.refresh_from_db()
    assert (job.state, job.end_reason, job.end_detail) == (
        State.RELEASED,
        EndReason.CANCELLED,
        "cancelled while running",
    )
    assert rank1.released_at > rank0.released_at


def test_when_one_parts_agent_fails_to_start_it_the_running_sibling_keeps_its_gpu_until_stopped(pool, team):
    """gpu-02's agent cannot start rank 1 (a secret deleted since intake): rank 0 is told to stop, keeps its GPU
    until it has, and the job then ends failed, saying why."""
    job = JobFactory(team=team, gpus=2)
    now = timezone.now()
    rank0, rank1 = _spanning(job, at=now)
    agent._release_failed(_part(rank1), "secrets: the team has no secret named HF_TOKEN any more")

    job.refresh_from_db()
    assert job.state == State.RUNNING and _holds(rank0) and not _holds(rank1)
    assert rental.stop_reason(allocation_id=rank0.id, now=now) == "sibling_failed"

    agent._after_exit(_part(rank0), None, "sibling_failed", -15)
    job.refresh_from_db()
    assert (job.state, job.end_reason) == (State.RELEASED, EndReason.FAILED) and not _holds(rank0)
    assert job.end_detail == "secrets: the team has no secret named HF_TOKEN any more"


def test_a_lost_node_frees_its_part_at_once_and_the_job_is_requeued_once_its_other_part_stopped(pool, team):
    job = JobFactory(team=team, gpus=2, requeue=True)
    now = timezone.now()
    rank0, rank1 = _spanning(job, at=now)
    nodes.set_node_state(name="gpu-02", target="down", now=now + timedelta(seconds=5), actor="olga")

    job.refresh_from_db()
    assert job.state == State.RUNNING and _holds(rank0) and not _holds(rank1)
    assert rental.stop_reason(allocation_id=rank0.id, now=now) == "sibling_failed"
    agent._after_exit(_part(rank0), None, "sibling_failed", -15)
    job.refresh_from_db()
    assert (job.state, job.lost_attempts) == (State.QUEUED, 1)
    assert job.events.get(to_state=State.QUEUED).reason == f"{REQUEUED}: marked down by olga"


def test_a_lost_parts_late_exit_report_does_not_overwrite_its_loss(pool, team):
    """Rank 0 exited 0 and its agent was still cleaning up when its node was marked down: the exit it reports
    afterwards must not turn the part's ``node_lost`` into ``succeeded``, which would leave the attempt no early
    end to requeue for, and the job ending ``failed`` when rank 1 stops."""
    job = JobFactory(team=team, gpus=2, requeue=True)
    now = timezone.now()
    rank0, rank1 = _spanning(job, at=now)
    nodes.set_node_state(name="gpu-01", target="down", now=now + timedelta(seconds=5), actor="olga")

    agent._after_exit(_part(rank0), None, EndReason.SUCCEEDED, 0)
    rank0.refresh_from_db()
    assert (rank0.end_reason, rank0.exit_code) == (EndReason.NODE_LOST, None)
    agent._after_exit(_part(rank1), None, "sibling_failed", -15)
    job.refresh_from_db()
    assert (job.state, job.lost_attempts) == (State.QUEUED, 1)


def test_the_reconciler_ends_an_attempt_whose_other_part_never_reports(pool, team):
    """Rank 1's agent failed; rank 0's agent never reports again: the attempt is not left holding rank 0's GPU."""
    job = JobFactory(team=team, gpus=2)
    then = timezone.now() - timedelta(hours=1)
    rank0, rank1 = _spanning(job, at=then)
    agent._release_failed(_part(rank1), "the node agent failed: boom")
    Job.objects.filter(id=job.id).update(worker_seen_at=then)

    reconciler.reconcile(now=timezone.now())
    job.refresh_from_db()
    assert (job.state, job.end_reason) == (State.RELEASED, EndReason.NODE_LOST) and not _holds(rank0)


def test_an_attempt_that_was_replaced_no_longer_speaks_for_the_job(pool):
    """Attempt 1's agent checks its allocation (not released yet), the job is requeued and attempt 2 placed,
    then the old agent's sign of life lands: it must not keep attempt 2 looking alive, or the reconciler would
    never find attempt 2's silent agent."""
    job = JobFactory(requeue=True)
    first = _running(job, at=timezone.now() - timedelta(minutes=10))
    assert rental.release_job(job_id=job.id, end_reason=EndReason.NODE_LOST, now=timezone.now(), actor="test",
                              requeue_as=REQUEUED)  # fmt: skip
    job.refresh_from_db()
    assert job.state == State.QUEUED
    _running(job, node="gpu-02", at=timezone.now())
    silent_since = timezone.now() - timedelta(minutes=5)
    Job.objects.filter(id=job.id).update(worker_seen_at=silent_since)
    rental.note_worker_alive(job_id=job.id, attempt=first.attempt, now=timezone.now())
    assert Job.objects.get(id=job.id).worker_seen_at == silent_since
    rental.note_worker_alive(job_id=job.id, attempt=first.attempt + 1, now=timezone.now())
    assert Job.objects.get(id=job.id).worker_seen_at > silent_since
