"""A job saving its checkpoint is still a running process on its GPUs: its agent goes on reporting through the
checkpoint's grace, so the reconciler never takes it for silent; and a cancel asked for meanwhile ends the grace
(TERM, then E31_KILL_GRACE_S, as for any job), since a cancelled job's checkpoint is removed anyway."""

import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from jobs import agent, reconciler, rental, sandbox, services
from jobs.lifecycle import EndReason, State
from jobs.models import Allocation, GpuHold, Job
from tests.factories import JobFactory, MembershipFactory, NodeFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)  # the agent's thread reads what the test wrote
IGNORES_USR1 = (
    "import signal, time\n"
    "signal.signal(signal.SIGUSR1, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "while True: time.sleep(0.05)\n"
)


def _running_part(team, *, grace_s: int):
    """A pausable job running for an hour (its meter on), last reported alive as it started, as every job is
    (staging, then its agent's checks, beat ``worker_seen_at``); its part as loaded."""
    node = NodeFactory(name="gpu-grace", gpus=1)
    began = timezone.now() - timedelta(hours=1)
    job = JobFactory(team=team, preemptible=True, checkpoint_signal="USR1", checkpoint_grace_s=grace_s,
                     checkpoint_bytes=10**6, hours=4, worker_seen_at=began)  # fmt: skip
    assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: (0,)}, now=began)
    allocation = Allocation.objects.get(job=job)
    assert rental.start_allocation(allocation_id=allocation.id, now=began)
    return job, allocation, agent._load_part(allocation.id, sandbox.UNSANDBOXED, None)


def _preempted_part(team, *, grace_s: int):
    """As ``_running_part``, its preemption just asked for."""
    job, allocation, part = _running_part(team, grace_s=grace_s)
    assert rental.request_preemption(job_id=job.id, now=timezone.now())
    return job, allocation, part


class _Supervised:
    """The agent's supervision of a process that ignores its checkpoint signal, on a thread of its own."""

    def __init__(self, part, tmp_path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", IGNORES_USR1], stdout=subprocess.PIPE, start_new_session=True
        )
        assert self.proc.stdout.readline() == b"ready\n"
        capture = agent.LogCapture(self.proc.stdout, tmp_path / "job.log", 10**6)
        capture.start()
        self.result: list = []

        def supervise() -> None:
            try:
                self.result.append(agent._supervise(part, self.proc, capture, sandbox.UNSANDBOXED))
            finally:
                connections.close_all()

        self.thread = threading.Thread(target=supervise)
        self.thread.start()

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.thread.join(timeout=15)


def test_the_reconciler_does_not_release_a_job_saving_its_checkpoint(team, settings, monkeypatch, tmp_path):
    """Compressed: the reconciler gives up on an agent silent for 2 s; the job's grace is 6 s (the defaults: 60
    and 120 s, so any checkpoint taking more than a minute was released under its process)."""
    settings.E31_RECONCILE_AFTER_S = 2
    monkeypatch.setattr(agent, "SEEN_EVERY_S", 0.5)
    job, allocation, part = _preempted_part(team, grace_s=6)
    supervised = _Supervised(part, tmp_path)
    try:
        time.sleep(4)  # past the reconciler's 2 s, inside the 6 s grace
        assert supervised.proc.poll() is None  # still saving, on its GPU
        reconciler.reconcile(now=timezone.now())
        allocation.refresh_from_db()
        job.refresh_from_db()
        assert allocation.released_at is None, f"released under a running process: {job.end_detail!r}"
        assert GpuHold.objects.filter(allocation=allocation, active=True).exists()
        assert job.state == State.RUNNING and job.lost_attempts == 0
    finally:
        supervised.end()
    assert supervised.result == [("preempted", -signal.SIGKILL)]  # the whole grace, then the kill


def test_a_job_preempted_while_it_runs_is_reported_alive_through_its_checkpoint_grace(
    team, settings, monkeypatch, tmp_path
):
    """A pausable job preempted for a reservation, saving its checkpoint within its declared grace (120 s by
    default, up to an hour), was no longer reported alive from the moment the preemption was asked for: the
    reconciler released it as ``node_lost`` after 60 s, its GPUs handed to the reserved job while its process still
    wrote its checkpoint, the checkpoint cut short and the attempt counted as lost (after E31_MAX_ATTEMPTS such
    preemptions the job ended node_lost instead of resuming). Compressed: the reconciler gives up after 2 s, the
    grace is 6 s."""
    settings.E31_RECONCILE_AFTER_S = 2
    monkeypatch.setattr(agent, "SEEN_EVERY_S", 0.5)
    job, allocation, part = _running_part(team, grace_s=6)
    supervised = _Supervised(part, tmp_path)
    try:
        time.sleep(1.0)  # the job runs; its agent reports it alive
        assert Job.objects.get(id=job.id).worker_seen_at > timezone.now() - timedelta(seconds=2)
        assert rental.request_preemption(job_id=job.id, now=timezone.now())  # a reservation needs the GPU
        asked = timezone.now()
        time.sleep(4)  # past the reconciler's 2 s, inside the 6 s grace
        assert supervised.proc.poll() is None  # still saving, on its GPU
        assert Job.objects.get(id=job.id).worker_seen_at > asked + timedelta(
            seconds=2
        )  # still reported alive
        findings = reconciler.reconcile(now=timezone.now())
        allocation.refresh_from_db()
        job.refresh_from_db()
        assert job.id not in findings.abandoned
        assert allocation.released_at is None, (
            f"released under a process still saving its checkpoint: {job.state} {job.end_reason} "
            f"lost_attempts={job.lost_attempts} {job.end_detail!r}"
        )
        assert GpuHold.objects.filter(allocation=allocation, active=True).exists()
        assert job.state == State.RUNNING and job.lost_attempts == 0
    finally:
        supervised.end()
    assert supervised.result == [("preempted", -signal.SIGKILL)]  # the whole grace, then the kill
    agent._after_exit(part, None, "preempted", supervised.result[0][1])
    job.refresh_from_db()
    assert (job.state, job.lost_attempts) == (State.QUEUED, 0)  # paused, to resume: not lost


def test_a_cancel_during_the_checkpoint_grace_ends_it_within_the_kill_grace(team, settings, tmp_path):
    settings.E31_KILL_GRACE_S = 1
    member = MembershipFactory(team=team, user=UserFactory(username="carol")).user
    job, _allocation, part = _preempted_part(team, grace_s=40)
    supervised = _Supervised(part, tmp_path)
    try:
        time.sleep(1.5)  # the checkpoint signal sent, 40 s of grace begun
        assert services.cancel_job(job_id=job.id, user=member, now=timezone.now())
        cancelled = time.monotonic()
        supervised.thread.join(timeout=8)  # a check (1 s), TERM, the kill grace (1 s): not the 40 s
        assert not supervised.thread.is_alive(), (
            f"still in the checkpoint grace {time.monotonic() - cancelled:.1f} s after the cancel"
        )
        assert time.monotonic() - cancelled < 4
    finally:
        supervised.end()
    assert supervised.result and supervised.result[0][0] == "preempted"
    agent._after_exit(part, None, "preempted", supervised.result[0][1])
    job.refresh_from_db()
    assert (job.state, job.end_reason) == (State.RELEASED, EndReason.CANCELLED)


def test_the_time_limit_ends_a_checkpoint_grace_that_would_run_past_it(team, settings, tmp_path):
    """Reproduction: a pausable job 2 s before its 1-hour limit was asked to stop for a reservation; it kept its
    whole 20 s of grace past the limit (the limit was not checked once a preemption was asked for), billed, and
    was requeued as preempted, its next attempt given a whole hour again. The limit ends the grace as it ends any
    job (TERM, then E31_KILL_GRACE_S), and the job ends timed out."""
    settings.E31_KILL_GRACE_S = 1
    node = NodeFactory(name="gpu-grace", gpus=1)
    began = timezone.now() - timedelta(seconds=3600 - 2)  # 2 s left of its hour
    job = JobFactory(team=team, preemptible=True, checkpoint_signal="USR1", checkpoint_grace_s=20,
                     checkpoint_bytes=10**6, hours=1, worker_seen_at=began)  # fmt: skip
    assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: (0,)}, now=began)
    allocation = Allocation.objects.get(job=job)
    assert rental.start_allocation(allocation_id=allocation.id, now=began)
    part = agent._load_part(allocation.id, sandbox.UNSANDBOXED, None)
    assert rental.request_preemption(job_id=job.id, now=timezone.now())
    asked = time.monotonic()
    supervised = _Supervised(part, tmp_path)
    try:
        supervised.thread.join(timeout=12)  # the limit (2 s), a check (1 s), TERM, the kill grace (1 s)
        assert not supervised.thread.is_alive(), f"still in its grace {time.monotonic() - asked:.1f} s on"
        assert time.monotonic() - asked < 8
    finally:
        supervised.end()
    assert supervised.result and supervised.result[0][0] == EndReason.TIMED_OUT
    settings.E31_AGENT_ROOT = tmp_path / "agents"
    dirs = sandbox.attempt_dirs(allocation)
    dirs.output.mkdir(parents=True)  # it wrote nothing: an empty output is sealed
    agent._after_exit(part, dirs, supervised.result[0][0], supervised.result[0][1])
    job.refresh_from_db()
    assert (job.state, job.end_reason) == (State.RELEASED, EndReason.TIMED_OUT)
