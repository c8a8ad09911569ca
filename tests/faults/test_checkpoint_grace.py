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
from jobs.models import Allocation, GpuHold
from tests.factories import JobFactory, MembershipFactory, NodeFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)  # the agent's thread reads what the test wrote
IGNORES_USR1 = (
    "import signal, time\n"
    "signal.signal(signal.SIGUSR1, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "while True: time.sleep(0.05)\n"
)


def _preempted_part(team, *, grace_s: int):
    """A pausable job running for an hour (its meter on), its preemption just asked for; its part as loaded."""
    node = NodeFactory(name="gpu-grace", gpus=1)
    job = JobFactory(team=team, preemptible=True, checkpoint_signal="USR1", checkpoint_grace_s=grace_s,
                     checkpoint_bytes=10**6)  # fmt: skip
    began = timezone.now() - timedelta(hours=1)
    assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: (0,)}, now=began)
    allocation = Allocation.objects.get(job=job)
    assert rental.start_allocation(allocation_id=allocation.id, now=began)
    assert rental.request_preemption(job_id=job.id, now=timezone.now())
    return job, allocation, agent._load_part(allocation.id, sandbox.UNSANDBOXED, None)


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
