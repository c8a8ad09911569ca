"""Pausable jobs on the node: the checkpoint directory each attempt hands on, its bound, its signal, its end."""

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.utils import timezone

from jobs import agent, attempt_space, checkpoints, presenters, rental, sandbox, snapshot, trees
from jobs.models import Allocation, Job, JobEvent
from tests.factories import JobFactory, NodeFactory

JOB_UID = 300777
LIMIT = 1000
MB = 10**6
pytestmark = pytest.mark.django_db


@pytest.fixture
def ckpt_root(settings, tmp_path):
    tmp_path.chmod(0o711)
    settings.E31_CHECKPOINT_ROOT = tmp_path / "checkpoints"
    yield settings.E31_CHECKPOINT_ROOT
    attempt_space.release_all(tmp_path)  # what a test left mounted


def _pausable(team, **kw):
    defaults = {
        "preemptible": True,
        "checkpoint_signal": "USR1",
        "checkpoint_grace_s": 2,
        "checkpoint_bytes": 1000,
    }
    return JobFactory(team=team, **{**defaults, **kw})


def _running_part(job, attempt=1):
    node = NodeFactory(name=f"gpu-{job.id}-{attempt}")
    Job.objects.filter(id=job.id).update(attempt=attempt, state="running")
    allocation = Allocation.objects.create(
        job=job, attempt=attempt, node=node, rank=0, gpu_indices=[0], rented_at=timezone.now()
    )
    return agent._load_part(allocation.id, "none", None)


@pytest.mark.skipif(os.geteuid() != 0, reason="re-owning to a job uid needs root")
def test_the_directory_is_the_attempts_own_while_it_runs_and_the_agents_after(ckpt_root):
    path = checkpoints.prepare(42, owner=JOB_UID, limit=LIMIT)
    (path / "step.txt").write_text("7")
    assert (path.stat().st_uid, oct(path.stat().st_mode & 0o777)) == (JOB_UID, "0o700")
    assert oct(ckpt_root.stat().st_mode & 0o777) == "0o711"  # passable, never listable by a job
    # The next attempt's uid gets what the last one wrote.
    checkpoints.prepare(42, owner=JOB_UID + 1, limit=LIMIT)
    assert (path / "step.txt").stat().st_uid == JOB_UID + 1
    kept = checkpoints.settle(42, limit=1000)
    assert kept == checkpoints.Kept(1) and not os.path.ismount(path)  # unmounted until the next attempt
    assert attempt_space.bound(path, size=attempt_space.MIN_BYTES, reuse=True, image=checkpoints.image(42))
    assert (path / "step.txt").stat().st_uid == os.geteuid()


def test_a_job_writing_past_its_checkpoint_bytes_fills_its_own_checkpoint_never_the_nodes_disk(ckpt_root):
    path = checkpoints.prepare(44, owner=os.getuid(), limit=MB)
    # Its own filesystem, with nothing in it to resume from.
    assert os.path.ismount(path) and os.listdir(path) == []
    with pytest.raises(OSError) as full, (path / "weights").open("wb") as out:
        for _ in range(200):
            out.write(b"x" * MB)
    assert full.value.errno == errno.ENOSPC
    assert (path / "weights").stat().st_size < 40 * MB  # the bound, with its filesystem's own room
    kept = checkpoints.settle(44, limit=MB)
    assert kept.bytes == 0 and "over its declared checkpoint.bytes" in kept.note
    assert not os.path.ismount(path)


def test_a_checkpoint_is_kept_unmounted_between_attempts_and_mounted_again_with_its_files(ckpt_root):
    path = checkpoints.prepare(45, owner=os.getuid(), limit=MB)
    (path / "step").write_text("30")
    assert checkpoints.settle(45, limit=MB) == checkpoints.Kept(2)
    assert not os.path.ismount(path)
    assert (checkpoints.prepare(45, owner=os.getuid(), limit=MB) / "step").read_text() == "30"
    checkpoints.remove(45)
    assert not path.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="re-owning to a job uid needs root")
def test_handing_a_checkpoint_on_never_follows_a_link_the_job_left_to_the_hosts_files(ckpt_root, tmp_path):
    host = tmp_path / "host"
    host.mkdir()
    (host / "shadow").write_text("secret")
    path = checkpoints.prepare(46, owner=JOB_UID, limit=MB)
    (path / "escape").symlink_to(host)
    (path / "file-link").symlink_to(host / "shadow")
    checkpoints.settle(46, limit=MB)
    checkpoints.prepare(46, owner=JOB_UID + 1, limit=MB)
    assert (path / "escape").lstat().st_uid == JOB_UID + 1  # the link itself is the job's
    assert (host.stat().st_uid, (host / "shadow").stat().st_uid) == (os.geteuid(), os.geteuid())


def test_the_image_is_the_agents_alone_and_a_link_in_its_place_is_never_mounted(ckpt_root):
    victim = checkpoints.prepare(47, owner=os.getuid(), limit=MB)
    (victim / "weights").write_text("team a's")
    checkpoints.settle(47, limit=MB)
    images = checkpoints.image(47).parent
    assert images.parent == ckpt_root and oct(images.stat().st_mode & 0o777) == "0o700"
    assert not checkpoints.image(47).is_relative_to(checkpoints.directory(47))  # never where a job can write
    checkpoints.image(48).symlink_to(checkpoints.image(47))  # a link where job 48's image would be
    attacker = checkpoints.prepare(48, owner=os.getuid(), limit=MB)
    assert os.path.ismount(attacker) and list(attacker.iterdir()) == []  # a fresh filesystem of its own
    assert not checkpoints.image(48).is_symlink()


def test_a_checkpoint_nested_deeper_than_any_walk_is_removed_with_a_note_not_an_error(ckpt_root):
    path = checkpoints.prepare(49, owner=os.getuid(), limit=MB)
    fd = os.open(path, os.O_RDONLY)
    for _ in range(1200):  # deeper than Python's recursion limit lets os.walk or os.fwalk go
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    kept = checkpoints.settle(49, limit=MB)
    assert kept.bytes == 0 and "nested too deeply" in kept.note and not os.path.ismount(path)


def test_a_lost_attempt_leaves_the_checkpoint_alone_once_a_newer_attempt_has_it(team, ckpt_root):
    job = _pausable(team, checkpoint_bytes=MB)
    part = _running_part(job, attempt=1)
    path = checkpoints.prepare(job.id, owner=os.getuid(), limit=MB)
    (path / "step").write_text("40")
    Job.objects.filter(id=job.id).update(attempt=2)  # requeued after the loss and running again elsewhere
    assert agent._settle_checkpoint(part) is None
    assert os.path.ismount(path) and (path / "step").read_text() == "40"


def test_a_checkpoint_past_its_declared_bytes_is_removed_whole_with_a_note(ckpt_root):
    path = checkpoints.prepare(43, owner=os.getuid(), limit=LIMIT)
    (path / "shard").mkdir()
    (path / "shard" / "weights").write_bytes(b"x" * 1500)
    kept = checkpoints.settle(43, limit=1000)
    assert (
        kept.bytes == 0 and "over its declared checkpoint.bytes" in kept.note and "from scratch" in kept.note
    )
    assert attempt_space.bound(path, size=attempt_space.MIN_BYTES, reuse=True, image=checkpoints.image(43))
    assert list(path.iterdir()) == []


def test_the_sandbox_binds_the_checkpoint_directory_where_the_job_is_told(tmp_path):
    root = tmp_path / "attempt"
    dirs = sandbox.AttemptDirs(root=root, work=root / "w", output=root / "o", data=tmp_path / "d",
                               checkpoint=tmp_path / "checkpoints" / "42")  # fmt: skip
    confinement = sandbox.Confinement(uid=JOB_UID, gid=JOB_UID)
    cmd = sandbox.command(
        argv=["true"], env={}, dirs=dirs, workdir="", mode=sandbox.BUBBLEWRAP, confinement=confinement
    )
    pairs = list(zip(cmd, cmd[1:], cmd[2:], strict=False))
    assert ("--bind", str(dirs.checkpoint), str(dirs.checkpoint)) in pairs
    assert sandbox.seen_inside(dirs, SimpleNamespace()).checkpoint == Path("/e31/checkpoint")
    plain = dataclass_without_checkpoint(dirs)
    cmd = sandbox.command(
        argv=["true"], env={}, dirs=plain, workdir="", mode=sandbox.BUBBLEWRAP, confinement=confinement
    )
    assert str(dirs.checkpoint) not in cmd


def dataclass_without_checkpoint(dirs):
    return sandbox.AttemptDirs(root=dirs.root, work=dirs.work, output=dirs.output, data=dirs.data)


def test_only_a_pausable_jobs_first_part_is_handed_the_directory(team, ckpt_root):
    part = _running_part(_pausable(team))
    assert agent._with_checkpoint(part, sandbox.attempt_dirs(part.allocation)).checkpoint == ckpt_root / str(
        part.job.id
    )
    plain = _running_part(JobFactory(team=team))
    assert agent._with_checkpoint(plain, sandbox.attempt_dirs(plain.allocation)).checkpoint is None


def _env(part):
    inside = SimpleNamespace(work="/w", data="/d", output="/o", checkpoint=checkpoints.directory(part.job.id))
    return agent._job_env(part, inside, None)


def test_the_next_attempt_starts_resumed_with_its_number_when_it_is_handed_a_checkpoint(team, ckpt_root):
    job = _pausable(team)
    first = _env(_running_part(job, attempt=1))
    checkpoints.prepare(job.id, owner=os.getuid(), limit=LIMIT)
    assert (first["E31_CHECKPOINT_DIR"], first["E31_RESUMED"], first["E31_ATTEMPT"]) == (
        str(ckpt_root / str(job.id)),
        "0",
        "1",
    )
    assert _env(_running_part(job, attempt=2))["E31_RESUMED"] == "0"  # nothing was saved: a fresh start
    (checkpoints.directory(job.id) / "step").write_text("3")
    second = _env(_running_part(job, attempt=3))
    assert (second["E31_RESUMED"], second["E31_ATTEMPT"]) == ("1", "3")


def test_a_job_that_does_not_checkpoint_sees_neither_variable(team):
    env = agent._job_env(
        _running_part(JobFactory(team=team)),
        SimpleNamespace(work="/w", data="/d", output="/o", checkpoint=None),
        None,
    )
    assert "E31_CHECKPOINT_DIR" not in env and "E31_RESUMED" not in env


def test_terminate_sends_the_declared_signal_then_kills_after_the_grace(tmp_path):
    marker = tmp_path / "got"
    code = (
        "import signal, sys, time, pathlib\n"
        f"signal.signal(signal.SIGUSR1, lambda *a: pathlib.Path({str(marker)!r}).write_text('usr1'))\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(0.05)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline() == b"ready\n"
    started = time.monotonic()
    exit_code = sandbox.terminate(proc, grace_s=1, mode=sandbox.UNSANDBOXED, sig=signal.SIGUSR1)
    assert marker.read_text() == "usr1" and exit_code == -signal.SIGKILL  # it ignored the stop: killed
    assert 1 <= time.monotonic() - started < 5


def test_a_grace_cut_short_sends_term_and_ends_within_the_short_grace():
    """Saving a checkpoint it will never need (cancelled meanwhile): TERM, and the short grace, not the 30 s."""
    code = "import signal, time\nsignal.signal(signal.SIGUSR1, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline() == b"ready\n"
    started = time.monotonic()
    exit_code = sandbox.terminate(
        proc, grace_s=30, mode=sandbox.UNSANDBOXED, sig=signal.SIGUSR1, short_grace_s=5,
        cut_short=lambda: time.monotonic() - started > 0.5,
    )  # fmt: skip
    assert exit_code == -signal.SIGTERM  # it took the TERM that followed
    assert 0.5 <= time.monotonic() - started < 3


def test_a_preempted_pausable_job_gets_its_signal_and_grace_any_other_stop_term(team, monkeypatch, settings):
    settings.E31_KILL_GRACE_S = 9
    sent = []
    monkeypatch.setattr(sandbox, "terminate", lambda proc, **kw: sent.append(kw) or 0)
    part = _running_part(_pausable(team, checkpoint_signal="HUP", checkpoint_grace_s=30))
    cancelled_meanwhile = lambda: False  # noqa: E731
    agent._stop(None, "preempted", part, sandbox.BUBBLEWRAP, cut_short=cancelled_meanwhile)
    agent._stop(None, "cancelled", part, sandbox.BUBBLEWRAP)
    assert sent == [
        {"grace_s": 30, "mode": sandbox.BUBBLEWRAP, "sig": signal.SIGHUP, "cut_short": cancelled_meanwhile,
         "short_grace_s": 9},  # a cancel meanwhile: TERM and the kill grace
        {"grace_s": 9, "mode": sandbox.BUBBLEWRAP},
    ]  # fmt: skip


def test_the_directory_goes_when_the_job_ends_however_it_ends_and_stays_between_attempts(team, ckpt_root):
    waiting, ended, cancelled = (_pausable(team, state=s) for s in ("queued", "released", "ended"))
    for job in (waiting, ended, cancelled):
        checkpoints.prepare(job.id, owner=os.getuid(), limit=LIMIT)
    checkpoints.prepare(999999, owner=os.getuid(), limit=LIMIT)  # a job that no longer exists
    assert sorted(agent.remove_ended_checkpoints()) == sorted([ended.id, cancelled.id, 999999])
    assert checkpoints.stored_job_ids() == [waiting.id]


def test_between_attempts_the_lifecycle_shows_the_job_paused_with_its_checkpoint(team):
    job = _pausable(team, state="running", attempt=1)
    rental.note_checkpoint(job_id=job.id, attempt=1, held_bytes=1_200_000_000, note="", now=timezone.now())
    Job.objects.filter(id=job.id).update(state="queued")
    job.refresh_from_db()
    steps = presenters.timeline(job, [], now=timezone.now())
    assert "paused (checkpoint 1.2 GB)" in [s.label for s in steps]
    assert presenters.paused(JobFactory(team=team, state="queued", attempt=1)) == ""


def test_an_older_attempt_never_overwrites_the_checkpoint_a_newer_one_noted(team):
    job = _pausable(team, state="running", attempt=2)
    rental.note_checkpoint(job_id=job.id, attempt=1, held_bytes=5, note="late", now=timezone.now())
    job.refresh_from_db()
    assert job.checkpoint_held_bytes is None and not JobEvent.objects.filter(job=job).exists()


def test_a_checkpoint_refused_for_its_size_is_said_in_the_jobs_events(team):
    job = _pausable(team, state="running", attempt=1)
    rental.note_checkpoint(
        job_id=job.id, attempt=1, held_bytes=0, note="its checkpoint … was removed", now=timezone.now()
    )
    assert JobEvent.objects.get(job=job).reason == "its checkpoint … was removed"


def test_a_node_loss_requeues_a_pausable_job_even_without_requeue(team, settings):
    settings.E31_MAX_ATTEMPTS = 3
    part = _running_part(_pausable(team, requeue=False))
    rental.lose_node_allocations(node=part.allocation.node, now=timezone.now(), detail="gone")
    job = Job.objects.get(id=part.job.id)
    assert (job.state, job.attempt) == ("queued", 1)


def test_a_checkpoint_rm_could_not_remove_is_not_reported_removed_and_never_stops_the_attempts_end(
    team, ckpt_root, monkeypatch
):
    """rm leaving some of it (a busy file system; trees.remove_tree's own test mounts one): the sweep leaves it for
    its next pass, and an attempt whose checkpoint could not be settled still ends, its uid and GPUs given back."""
    ended = _pausable(team, state="released")
    path = checkpoints.prepare(ended.id, owner=os.getuid(), limit=LIMIT)
    monkeypatch.setattr(trees, "remove_tree", lambda *paths: list(paths))
    assert agent.remove_ended_checkpoints() == [] and path.exists()
    monkeypatch.setattr(checkpoints, "settle", lambda *a, **k: (_ for _ in ()).throw(OSError("unreadable")))
    kept = agent._settle_checkpoint(_running_part(_pausable(team)))
    assert kept.bytes == 0 and "could not be handed on (unreadable)" in kept.note
    monkeypatch.undo()
    assert ended.id in agent.remove_ended_checkpoints() and not path.exists()


def test_a_checkpoint_hidden_past_the_longest_path_is_counted_and_removed_whole(ckpt_root):
    """Reproduction: a job kept 5 GiB seventeen folders of 250 characters down and 100 bytes at the top, under a
    checkpoint.bytes of 1 MB; the walk by path counted 100 bytes and the whole was handed on, past its bound."""
    from tests.jobs.test_hostile_output import hide_past_the_longest_path

    path = checkpoints.prepare(51, owner=os.getuid(), limit=MB)
    (path / "step").write_bytes(b"x" * 100)
    hide_past_the_longest_path(path, size=5 << 30)
    kept = checkpoints.settle(51, limit=MB)
    assert kept.bytes == 0 and "could not be read" in kept.note, kept
    assert not os.path.ismount(path)


def test_the_scheduler_sees_how_long_a_preempted_job_may_take_to_stop(team, settings):
    """The wait a preemption costs the job it makes room for: a pausable job's grace, any other's kill grace, from
    when the preemption was asked."""
    settings.E31_KILL_GRACE_S = 9
    asked = timezone.now()
    pausable = _pausable(team, checkpoint_grace_s=300)
    plain = JobFactory(team=team, preemptible=True)
    _running_part(pausable)
    _running_part(plain)
    Job.objects.filter(id=plain.id).update(preempt_requested_at=asked)
    seen = {r.job_id: (r.yield_s, r.preempt_asked_at) for r in snapshot._running()}
    assert seen == {pausable.id: (300, None), plain.id: (9, asked.timestamp())}
