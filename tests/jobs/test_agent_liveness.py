"""A part's agent says it is alive while it prepares the part and from its process's exit until the exit is
recorded: those steps (its attempt space made, its secrets read; its output tree given back to the agent, the
attempt space synced and trimmed) write nothing else, and the reconciler releases as lost any running job it hears
nothing of for E31_RECONCILE_AFTER_S. Nor does a part speak for its job
once its own allocation is released."""

import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import agent, attempt_space, limits, reconciler, rental, sandbox
from jobs.lifecycle import EndReason, State
from jobs.models import Allocation, Job
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db(transaction=True)  # the agent's threads read what the test wrote


@pytest.fixture
def compressed(settings, tmp_path, monkeypatch):
    """The reconciler gives up on a job silent for 2 s (60 s by default); the agent beats every 0.5 s (5 s)."""
    settings.E31_AGENT_ROOT = tmp_path / "agents"
    settings.E31_RECONCILE_AFTER_S = 2
    monkeypatch.setattr(agent, "SEEN_EVERY_S", 0.5)
    monkeypatch.setattr(limits, "bound_space", lambda root, job: False)  # no loop mount in these tests


def _rented(team, argv: list[str]) -> tuple[Job, Allocation]:
    """A job staged ten minutes ago (staging last beat it then), rented on a node."""
    node = NodeFactory(name="gpu-01", limits="none")
    job = JobFactory(team=team, argv=argv, worker_seen_at=timezone.now() - timedelta(minutes=10))
    assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: (0,)}, now=timezone.now())
    return job, Allocation.objects.get(job=job)


@pytest.mark.parametrize(
    "step",
    [
        pytest.param((sandbox, "reown"), id="its-output-tree-given-back-to-the-agent"),
        pytest.param((attempt_space, "give_back_unused"), id="its-attempt-space-synced-and-trimmed"),
    ],
)
def test_a_run_that_succeeded_is_not_released_as_lost_while_its_agent_cleans_up_after_it(
    team, compressed, monkeypatch, step
):
    """A job ran to a clean exit 0 after writing a large output; giving its tree back to the agent (a chown per
    file) or flushing its attempt space to disk (``sync`` then ``fstrim`` over an image sized for up to 1 TiB of
    output) took over a minute, and its agent recorded nothing meanwhile: the reconciler released it as
    ``node_lost``, its outputs never sealed nor delivered (or ran it again from scratch when it allowed requeue).
    Here that step takes 4 s, twice the compressed 2 s after which the reconciler gives up."""
    module, name = step
    job, allocation = _rented(team, [sys.executable, "-c", "print('done')"])
    real = getattr(module, name)
    found: list = []

    def slow(root) -> None:
        real(root)
        time.sleep(4)
        found.append(reconciler.reconcile(now=timezone.now()))

    monkeypatch.setattr(module, name, slow)
    agent.run_part(allocation_id=allocation.id, mode=sandbox.UNSANDBOXED, uids=None)
    _assert_succeeded_unabandoned(job, found, while_="cleaned up after an exit 0")


def _assert_succeeded_unabandoned(job: Job, found: list, *, while_: str) -> None:
    """The slow step ran and called the reconciler, which left the job alone; the job then ended as it ran."""
    job.refresh_from_db()
    assert found, f"the step never ran: the test did not exercise what its agent {while_}"
    assert job.id not in found[0].abandoned, (
        f"released as lost while its agent {while_}: {job.end_reason} {job.end_detail!r}"
    )
    assert (job.state, job.end_reason, job.lost_attempts) == (State.RELEASED, EndReason.SUCCEEDED, 0)


@pytest.mark.parametrize(
    "step",
    [
        pytest.param((limits, "bound_space"), id="its-attempt-space-made-and-mounted"),
        pytest.param((agent, "_secrets_for"), id="its-teams-secrets-read"),
    ],
)
def test_a_part_is_not_released_as_lost_while_its_agent_prepares_it(team, compressed, monkeypatch, step):
    """From its start until its process runs, a part's agent prepared it (its bounded attempt space made and
    mounted, its team's secrets read, its GPUs waited for, its network wired) saying nothing: a preparation over
    E31_RECONCILE_AFTER_S had the reconciler release the job as lost before it ran (or run it again from scratch).
    Here that step takes 4 s, twice the compressed 2 s after which the reconciler gives up."""
    module, name = step
    job, allocation = _rented(team, [sys.executable, "-c", "print('done')"])
    real = getattr(module, name)
    found: list = []

    def slow(*args):
        time.sleep(4)
        found.append(reconciler.reconcile(now=timezone.now()))
        return real(*args)

    monkeypatch.setattr(module, name, slow)
    agent.run_part(allocation_id=allocation.id, mode=sandbox.UNSANDBOXED, uids=None)
    _assert_succeeded_unabandoned(job, found, while_="prepared it")


def test_the_beats_after_the_exit_stop_once_it_is_recorded(team, compressed):
    """Once the exit is recorded (the seal says it is alive as it goes, by its progress) no timer goes on
    speaking for the job: a seal that hangs on a disk that no longer answers is left to the reconciler."""
    job, allocation = _rented(team, [sys.executable, "-c", "pass"])
    assert rental.start_allocation(allocation_id=allocation.id, now=timezone.now())
    beats = agent.QuietBeats(
        agent._load_part(allocation.id, sandbox.UNSANDBOXED, None), "cleaning up", limit_s=60
    )
    beats.start()
    time.sleep(1.2)
    beaten = Job.objects.get(id=job.id).worker_seen_at
    assert beaten > timezone.now() - timedelta(seconds=1)  # beating while the clean-up lasts
    beats.stop()
    assert not beats.thread.is_alive()
    time.sleep(1.2)
    assert Job.objects.get(id=job.id).worker_seen_at == beaten
    beats.start()  # a late start (a redelivered hook) does not start them again
    assert not beats.thread.is_alive()


def test_a_part_released_under_its_clean_up_does_not_speak_for_its_job(team, compressed):
    """A part whose node was declared lost while it cleaned up (its GPUs freed, its job requeued and maybe placed
    again) must not keep its job's next attempt looking alive."""
    job, allocation = _rented(team, [sys.executable, "-c", "pass"])
    assert rental.start_allocation(allocation_id=allocation.id, now=timezone.now())
    part = agent._load_part(allocation.id, sandbox.UNSANDBOXED, None)
    assert rental.release_part(
        allocation_id=allocation.id, end_reason=EndReason.NODE_LOST, now=timezone.now(), actor="reaper"
    )
    before = Job.objects.get(id=job.id).worker_seen_at
    beats = agent.QuietBeats(part, "cleaning up", limit_s=60)
    beats.start()
    try:
        time.sleep(1.2)
    finally:
        beats.stop()
    assert Job.objects.get(id=job.id).worker_seen_at == before


def test_a_watcher_does_not_speak_for_a_job_once_its_part_is_released(team, compressed):
    """The watcher reports a part alive through every stop (a checkpoint's grace included), but not once its
    allocation is released: its job may already run again elsewhere."""
    job, allocation = _rented(team, [sys.executable, "-c", "pass"])
    assert rental.start_allocation(allocation_id=allocation.id, now=timezone.now())
    part = agent._load_part(allocation.id, sandbox.UNSANDBOXED, None)
    assert rental.release_part(
        allocation_id=allocation.id, end_reason=EndReason.NODE_LOST, now=timezone.now(), actor="reaper"
    )
    before = Job.objects.get(id=job.id).worker_seen_at
    watcher = agent.Watcher(part, None)  # its checks, run here rather than on its thread
    try:
        assert watcher._check(time.monotonic(), seen=True)
        assert watcher.reason == "released"
    finally:
        watcher.connection.dec_thread_sharing()
    assert Job.objects.get(id=job.id).worker_seen_at == before
