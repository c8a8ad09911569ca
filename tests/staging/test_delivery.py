"""Delivery after RELEASE, off the meter: progress, verification at the destination, retries, leases."""

import hashlib
import os
import threading
import time
from datetime import timedelta

import fsspec
import pytest
from django.db import connection, transaction
from django.utils import timezone

from jobs import delivery, dispatch, logs, reconciler, sandbox, scheduler, signals
from jobs.models import Allocation, Dependency, Job, Node, OutputFile, OutputTransfer, SchedulerState
from jobs.transfers import sources
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db


def released_job(team, roots, files: dict[str, bytes], *, uri: str = "") -> Allocation:
    """A released job whose one part sealed ``files`` on its node, awaiting delivery."""
    now = timezone.now()
    manifest = [
        {"path": p, "bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()} for p, b in files.items()
    ]
    job = JobFactory(team=team, state="released", end_reason="succeeded", attempt=1, delivery_state="delivering",
                     output_uri=uri or f"file://{roots.outputs}/run1", sealed_files=len(manifest))  # fmt: skip
    OutputFile.objects.bulk_create(OutputFile(job=job, attempt=1, **entry) for entry in manifest)
    allocation = Allocation.objects.create(job=job, attempt=1, node=NodeFactory(), gpu_indices=[0],
                                           rented_at=now, released_at=now, sealed_at=now)  # fmt: skip
    output = sandbox.attempt_dirs(allocation).output
    for rel, content in files.items():
        (output / rel).parent.mkdir(parents=True, exist_ok=True)
        (output / rel).write_bytes(content)
    return allocation


def deliver(allocation: Allocation) -> Job:
    delivery.deliver_part(allocation_id=allocation.id, now=timezone.now())
    return Job.objects.get(id=allocation.job_id)


def test_outputs_are_delivered_with_progress_and_checked_at_the_destination(roots, team):
    files = {"model.bin": os.urandom(300_000), "logs/train.txt": b"loss 0.1\n"}
    allocation = released_job(team, roots, files)
    job = deliver(allocation)
    assert (job.delivery_state, job.delivered_at is not None) == ("delivered", True)
    assert job.delivered_at >= allocation.released_at  # off the meter
    for rel, content in files.items():
        assert (roots.outputs / "run1" / f"{job.id}-1" / rel).read_bytes() == content
    transfer = OutputTransfer.objects.get(allocation=allocation)
    assert (transfer.state, transfer.bytes_done, transfer.bytes_total) == ("delivered", 300_009, 300_009)
    assert (transfer.files_done, transfer.files_total) == (2, 2)
    assert not list((roots.outputs / "run1").rglob("*.e31part"))


@pytest.mark.parametrize("uri, end", [("", "delivered"), ("file:///elsewhere/run1", "failed")])
def test_a_delivered_job_asks_for_a_pass_so_the_jobs_waiting_for_its_outputs_go_on_at_once(
    roots, team, settings, django_capture_on_commit_callbacks, uri, end
):
    settings.E31_TRANSFER_RETRIES = 0
    dispatch.state_row()
    allocation = released_job(team, roots, {"model.bin": b"weights"}, uri=uri)
    with django_capture_on_commit_callbacks(execute=True):  # the flag is raised once the delivery commits
        assert deliver(allocation).delivery_state == end
    assert SchedulerState.objects.get().pass_requested


def test_a_file_that_differs_from_its_manifest_is_never_put_in_place(roots, team, settings):
    settings.E31_TRANSFER_RETRIES = 1
    allocation = released_job(team, roots, {"a.bin": b"good" * 100})
    (sandbox.attempt_dirs(allocation).output / "a.bin").write_bytes(b"evil" * 100)  # changed after sealing
    job = deliver(allocation)
    assert job.delivery_state == "failed" and "checksum differs" in job.delivery_detail
    assert list((roots.outputs / "run1" / f"{job.id}-1").iterdir()) == []
    transfer = OutputTransfer.objects.get(allocation=allocation)
    assert transfer.state == "failed" and transfer.retries == 1


def test_a_planted_link_at_the_destination_cannot_lead_outside_it(roots, team):
    allocation = released_job(team, roots, {"sub/x.bin": b"x"})
    folder = roots.outputs / "run1" / f"{allocation.job_id}-1"
    folder.mkdir(parents=True)
    (folder / "sub").symlink_to(roots.outside)
    job = deliver(allocation)
    assert job.delivery_state == "failed" and "leads outside" in job.delivery_detail
    assert list(roots.outside.iterdir()) == []


def test_a_planted_link_as_the_attempt_folder_cannot_lead_outside_the_teams_folder(roots, team):
    allocation = released_job(team, roots, {"x.bin": b"x"})
    (roots.outputs / "run1").mkdir()
    (roots.outputs / "run1" / f"{allocation.job_id}-1").symlink_to(roots.outside)
    job = deliver(allocation)
    assert job.delivery_state == "failed" and "not under the team's folder" in job.delivery_detail
    assert list(roots.outside.iterdir()) == []


def test_a_link_planted_at_a_temporary_name_cannot_overwrite_another_teams_file(roots, team):
    """A member who can write in the team's output folder (a shared mount) plants, in the next attempt's folder,
    a link named like the temporary file delivery once wrote first (``.model.bin.e31part``), pointing at
    another team's file: delivery, which writes every team's folders, never writes through it."""
    victim = roots.output_root / "audio" / "results" / "model.bin"
    victim.parent.mkdir(parents=True)
    victim.write_bytes(b"audio's trained weights")
    allocation = released_job(team, roots, {"model.bin": b"vision's weights"})
    folder = roots.outputs / "run1" / f"{allocation.job_id}-1"
    folder.mkdir(parents=True)
    (folder / ".model.bin.e31part").symlink_to(victim)
    assert deliver(allocation).delivery_state == "delivered"
    assert victim.read_bytes() == b"audio's trained weights"
    assert not (folder / "model.bin").is_symlink()
    assert (folder / "model.bin").read_bytes() == b"vision's weights"


def test_a_link_planted_as_the_folder_of_files_in_transit_is_not_followed(roots, team):
    allocation = released_job(team, roots, {"a.bin": b"a"})
    (roots.outputs / "run1").mkdir()
    (roots.outputs / "run1" / f".{allocation.job_id}-1.rank0.e31part").symlink_to(roots.outside)
    job = deliver(allocation)
    assert job.delivery_state == "delivered", job.delivery_detail
    assert list(roots.outside.iterdir()) == []
    assert (roots.outputs / "run1" / f"{job.id}-1" / "a.bin").read_bytes() == b"a"
    assert not list((roots.outputs / "run1").rglob("*.e31part"))


def test_an_output_named_like_a_temporary_file_is_delivered_beside_the_file_it_is_named_after(roots, team):
    """A job writes ``ckpt`` and ``.ckpt.e31part`` (any name is allowed): once the job says delivered, both are
    at the destination, neither taken for the other's temporary file."""
    files = {"ckpt": b"the checkpoint", ".ckpt.e31part": b"a file the job wrote"}
    job = deliver(released_job(team, roots, files))
    assert job.delivery_state == "delivered"
    for rel, content in files.items():
        assert (roots.outputs / "run1" / f"{job.id}-1" / rel).read_bytes() == content


def test_a_destination_of_another_teams_folder_is_refused_at_delivery_too(roots, team):
    """Intake refuses it; a row written another way (or roots changed since) is still not delivered."""
    (roots.output_root / "audio").mkdir()
    job = deliver(released_job(team, roots, {"ok.txt": b"B"}, uri=f"file://{roots.output_root}/audio/demo1"))
    assert job.delivery_state == "failed" and "not under the team's folder" in job.delivery_detail
    assert not (roots.output_root / "audio" / "demo1").exists()


def test_two_jobs_with_one_destination_never_replace_each_others_files(roots, team):
    """Reproduction 5, within one team: a second delivery to the same destination leaves the first intact."""
    first = deliver(released_job(team, roots, {"ok.txt": b"first"}))
    second = deliver(released_job(team, roots, {"ok.txt": b"second"}))
    assert (first.delivery_state, second.delivery_state) == ("delivered", "delivered")
    assert (roots.outputs / "run1" / f"{first.id}-1" / "ok.txt").read_bytes() == b"first"
    assert (roots.outputs / "run1" / f"{second.id}-1" / "ok.txt").read_bytes() == b"second"
    assert sorted(p.name for p in (roots.outputs / "run1").iterdir()) == sorted(
        [f"{first.id}-1", f"{second.id}-1", f"{first.id}-1.log", f"{second.id}-1.log"]
    )


def test_a_stored_destination_with_a_query_never_makes_two_jobs_share_a_folder(roots, team):
    """Intake refuses "?" and "#" in a file URI; a job stored before that is refused here, not delivered into
    .../shared over the files of the job before (the attempt's folder would go into the query)."""
    first = deliver(released_job(team, roots, {"ok.txt": b"first"}, uri=f"file://{roots.outputs}/shared?x"))
    second = deliver(released_job(team, roots, {"ok.txt": b"second"}, uri=f"file://{roots.outputs}/shared#x"))
    for job in (first, second):
        assert job.delivery_state == "failed" and 'no "?" or "#"' in job.delivery_detail
    assert not (roots.outputs / "shared").exists()


def test_a_rerun_of_the_same_job_delivers_into_a_new_attempt_folder(roots, team):
    first = released_job(team, roots, {"ok.txt": b"attempt 1"})
    deliver(first)
    job = first.job
    now = timezone.now()
    Job.objects.filter(id=job.id).update(attempt=2, delivered_at=None, delivery_state="delivering")
    second = Allocation.objects.create(job=job, attempt=2, node=first.node, gpu_indices=[0],
                                       rented_at=now, released_at=now, sealed_at=now)  # fmt: skip
    (sandbox.attempt_dirs(second).output).mkdir(parents=True, exist_ok=True)
    (sandbox.attempt_dirs(second).output / "ok.txt").write_bytes(b"attempt 2")
    OutputFile.objects.create(job=job, attempt=2, **_entry("ok.txt", b"attempt 2"))
    assert deliver(second).delivery_state == "delivered"
    assert (roots.outputs / "run1" / f"{job.id}-1" / "ok.txt").read_bytes() == b"attempt 1"
    assert (roots.outputs / "run1" / f"{job.id}-2" / "ok.txt").read_bytes() == b"attempt 2"


def _entry(path: str, content: bytes) -> dict:
    return {"path": path, "bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}


def test_s3_delivery_without_the_optional_extra_fails_with_a_clear_reason(roots, team, monkeypatch, settings):
    settings.E31_S3_ROOTS = ["s3://bucket"]
    monkeypatch.setitem(__import__("sys").modules, "s3fs", None)
    job = deliver(released_job(team, roots, {"a.bin": b"a"}, uri=f"s3://bucket/{team.slug}/run1"))
    assert job.delivery_state == "failed" and "optional 's3' extra (s3fs)" in job.delivery_detail


@pytest.mark.parametrize("s3_roots", [["s3://bucket"], []])
def test_s3_delivery_outside_the_teams_prefix_is_refused_before_anything_is_written(
    roots, team, settings, s3_roots
):
    """Intake refuses it; delivery checks the team's prefix of the S3 roots configured now before it writes."""
    settings.E31_S3_ROOTS = s3_roots
    job = deliver(released_job(team, roots, {"a.bin": b"a"}, uri="s3://bucket/audio/run1"))
    assert job.delivery_state == "failed" and "not under the team's prefix" in job.delivery_detail


def test_a_duplicate_task_does_nothing_while_a_live_one_holds_the_lease(roots, team):
    allocation = released_job(team, roots, {"a.bin": b"a"})
    OutputTransfer.objects.create(allocation=allocation, job=allocation.job, token="live", state="delivering",
                                  updated_at=timezone.now())  # fmt: skip
    job = deliver(allocation)
    assert job.delivery_state == "delivering" and not (roots.outputs / "run1").exists()


def test_a_silent_task_loses_its_lease_to_the_next(roots, team):
    allocation = released_job(team, roots, {"a.bin": b"a"})
    OutputTransfer.objects.create(allocation=allocation, job=allocation.job, token="dead", state="delivering",
                                  updated_at=timezone.now() - timezone.timedelta(hours=1))  # fmt: skip
    assert deliver(allocation).delivery_state == "delivered"


def test_no_more_than_the_configured_deliveries_run_at_once_per_node(roots, team, settings):
    settings.E31_DELIVERY_CONCURRENCY = 1
    first = released_job(team, roots, {"a.bin": b"a"})
    now = timezone.now()
    busy = OutputTransfer.objects.create(allocation=first, job=first.job, token="t1", updated_at=now)
    assert delivery.claim_slot(transfer=busy, node_id=first.node_id, now=now)
    second = Allocation.objects.create(job=JobFactory(team=team, state="released", end_reason="succeeded"),
                                       attempt=1, node=first.node, gpu_indices=[1], rented_at=now, released_at=now)  # fmt: skip
    waiting = OutputTransfer.objects.create(allocation=second, job=second.job, token="t2", updated_at=now)
    assert not delivery.claim_slot(transfer=waiting, node_id=first.node_id, now=now)
    other_node = NodeFactory()
    assert delivery.claim_slot(transfer=waiting, node_id=other_node.id, now=now)  # the limit is per node


def test_the_whole_log_is_delivered_beside_the_outputs(roots, team):
    """The log of the attempt lands next to its output folder, never among the job's own files."""
    allocation = released_job(team, roots, {"job.log": b"the job's own file"})
    text = b"epoch 1\n" * 50_000 + "fin \u00e9\n".encode()  # more than one stored chunk
    logs.append_log(job_id=allocation.job_id, attempt=1, rank=0, offset=0, data=text)
    job = deliver(allocation)
    assert job.delivery_state == "delivered"
    assert (roots.outputs / "run1" / f"{job.id}-1.log").read_bytes() == text
    assert (roots.outputs / "run1" / f"{job.id}-1" / "job.log").read_bytes() == b"the job's own file"
    assert not list((roots.outputs / "run1").rglob("*.e31part"))


def test_each_part_of_a_job_spanning_nodes_delivers_its_own_log(roots, team):
    first = released_job(team, roots, {"rank0/a.txt": b"a"})
    now = timezone.now()
    second = Allocation.objects.create(job=first.job, attempt=1, rank=1, node=NodeFactory(), gpu_indices=[0],
                                       rented_at=now, released_at=now, sealed_at=now)  # fmt: skip
    output = sandbox.attempt_dirs(first).output
    (output / "rank0" / "a.txt").rename(output / "a.txt")
    sandbox.attempt_dirs(second).output.mkdir(parents=True, exist_ok=True)
    (sandbox.attempt_dirs(second).output / "b.txt").write_bytes(b"b")
    OutputFile.objects.create(job=first.job, attempt=1, **_entry("rank1/b.txt", b"b"))
    for rank in (0, 1):
        logs.append_log(job_id=first.job_id, attempt=1, rank=rank, offset=0, data=f"rank {rank}\n".encode())
    deliver(first)
    job = deliver(second)
    assert job.delivery_state == "delivered"
    for rank in (0, 1):
        assert (roots.outputs / "run1" / f"{job.id}-1.rank{rank}.log").read_text() == f"rank {rank}\n"


def test_a_link_planted_where_the_log_is_written_is_not_followed(roots, team):
    allocation = released_job(team, roots, {"a.txt": b"a"})
    logs.append_log(job_id=allocation.job_id, attempt=1, rank=0, offset=0, data=b"secret-free log\n")
    (roots.outputs / "run1").mkdir()
    (roots.outputs / "run1" / f".{allocation.job_id}-1.log.e31part").symlink_to(roots.outside / "victim")
    job = deliver(allocation)
    assert job.delivery_state == "delivered"
    assert not (roots.outside / "victim").exists()
    assert (roots.outputs / "run1" / f"{job.id}-1.log").read_bytes() == b"secret-free log\n"


@pytest.fixture
def memory_s3(monkeypatch, settings):
    """An in-memory filesystem where s3fs would be (the extra is optional): what delivery writes, as written."""
    settings.E31_S3_ROOTS = ["s3://bucket"]
    fs = fsspec.filesystem("memory")
    fs.store.clear()
    monkeypatch.setattr(sources, "filesystem_for", lambda uri: fs)
    return fs


@pytest.mark.parametrize("name", ["model.bin", "run#1.json", "what?.txt", "%2e%2e", "100%.txt", "a/b/c.txt"])
def test_s3_delivery_takes_any_name_a_file_may_have_as_a_literal_key(roots, team, memory_s3, name):
    job = deliver(released_job(team, roots, {name: b"abc"}, uri=f"s3://bucket/{team.slug}/run1"))
    assert job.delivery_state == "delivered", job.delivery_detail
    folder = f"s3://bucket/{team.slug}/run1/{job.id}-1"
    assert memory_s3.store[f"{folder}/{name}"].getvalue() == b"abc"  # the key as the manifest names it
    assert f"{folder}.log" in memory_s3.store  # the part's log, beside the folder


@pytest.mark.django_db(transaction=True)
def test_the_last_of_two_parts_delivered_at_once_marks_the_job_delivered():
    """Each part's task records its own delivery and looks for parts still to deliver: run at once, each saw the
    other's row as it was before the other committed, and the job stayed "delivering" for ever (seen in CI)."""
    now = timezone.now()
    job = JobFactory(state="released", end_reason="succeeded", attempt=1, delivery_state="delivering")
    parts = []
    for rank in (0, 1):
        allocation = Allocation.objects.create(job=job, attempt=1, rank=rank, node=NodeFactory(), gpu_indices=[0],
                                               rented_at=now, released_at=now, sealed_at=now)  # fmt: skip
        transfer = OutputTransfer.objects.create(
            allocation=allocation, job=job, state="delivering", updated_at=now
        )
        parts.append((transfer, Allocation.objects.select_related("job").get(id=allocation.id)))
    first_recorded, errors = threading.Event(), []

    def first():
        try:
            with transaction.atomic():  # its records stay uncommitted until the second part's task has looked
                delivery._delivered(*parts[0])
                first_recorded.set()
                time.sleep(0.5)
        except Exception as exc:  # a failure in a thread must fail the test
            errors.append(exc)
        finally:
            connection.close()

    def second():
        try:
            first_recorded.wait(5)
            delivery._delivered(*parts[1])
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    job.refresh_from_db()
    assert (job.delivery_state, job.delivered_at is not None) == ("delivered", True)


def test_the_reconciler_marks_delivered_a_job_whose_every_part_is_delivered():
    # Left so by the race above before it was fixed: nothing else would ever finish it.
    now = timezone.now()
    stuck = JobFactory(state="released", end_reason="succeeded", attempt=2, delivery_state="delivering")
    going = JobFactory(state="released", end_reason="succeeded", attempt=1, delivery_state="delivering")
    for job, rank, delivered in ((stuck, 0, now - timedelta(minutes=9)), (stuck, 1, now - timedelta(minutes=8)),
                                 (going, 0, now), (going, 1, None)):  # fmt: skip
        Allocation.objects.create(job=job, attempt=job.attempt, rank=rank, node=NodeFactory(), gpu_indices=[0],
                                  rented_at=now, released_at=now, sealed_at=now, delivered_at=delivered)  # fmt: skip
    # An earlier attempt's part, never delivered, is not the job's to wait for.
    Allocation.objects.create(job=stuck, attempt=1, node=NodeFactory(), gpu_indices=[0], rented_at=now,
                              released_at=now)  # fmt: skip
    assert reconciler.reconcile(now=now).delivered == [stuck.id]
    stuck.refresh_from_db(), going.refresh_from_db()
    assert (stuck.delivery_state, stuck.delivered_at) == ("delivered", now - timedelta(minutes=8))
    assert (going.delivery_state, going.delivered_at) == ("delivering", None)


def test_a_delivery_whose_node_has_been_down_past_the_grace_fails_and_its_dependents_go_on(
    roots, team, settings
):
    settings.E31_DELIVERY_NODE_GRACE_S = 3600
    NodeFactory(name="spare")  # where the job after it can run
    now = timezone.now()
    stranded, waiting = released_job(team, roots, {"a.txt": b"a"}), released_job(team, roots, {"b.txt": b"b"})
    Node.objects.filter(id=stranded.node_id).update(state="down", state_changed_at=now - timedelta(hours=2))
    Node.objects.filter(id=waiting.node_id).update(state="down", state_changed_at=now - timedelta(minutes=30))
    after_it = JobFactory(team=team, state="queued")
    Dependency.objects.create(job=after_it, prerequisite=stranded.job, kind=Dependency.AFTER_ANY)

    assert reconciler.reconcile(now=now).undeliverable == [stranded.job_id]
    job = Job.objects.get(id=stranded.job_id)
    assert job.delivery_state == "failed"
    assert job.delivery_detail.startswith(
        f"not delivered: node {stranded.node.name}, which holds this attempt's"
    )
    # A node down for less than the grace may come back: its job still waits for it.
    assert Job.objects.get(id=waiting.job_id).delivery_state == "delivering"
    scheduler.run_pass(now=now)
    after_it.refresh_from_db()
    assert after_it.state == "rented"


def _sealed_part(job, *, attempt, rank, files: dict[str, bytes], released_at, multi: bool) -> Allocation:
    """A part of ``attempt`` that sealed ``files`` on its own node (manifest rows and the files on its disk)."""
    allocation = Allocation.objects.create(job=job, attempt=attempt, rank=rank, node=NodeFactory(), gpu_indices=[0],
                                           rented_at=released_at - timedelta(minutes=5), released_at=released_at,
                                           sealed_at=released_at)  # fmt: skip
    prefix = f"rank{rank}/" if multi else ""
    OutputFile.objects.bulk_create(
        OutputFile(job=job, attempt=attempt, **_entry(prefix + rel, content))
        for rel, content in files.items()
    )
    output = sandbox.attempt_dirs(allocation).output
    for rel, content in files.items():
        (output / rel).parent.mkdir(parents=True, exist_ok=True)
        (output / rel).write_bytes(content)
    return allocation


def test_a_task_that_lost_its_lease_does_not_fail_the_delivery_its_successor_finished(
    roots, team, monkeypatch, settings
):
    """A part's delivery task stalls on a hung destination mount for longer than the reconcile delay. The
    reconciler re-drives the part; the new task takes the lease over (as designed), delivers every file, marks
    the job delivered and removes the part's folder of files in transit. The old task then wakes: its next write
    fails (its folder is gone), and ``_failed`` marks the whole job's delivery failed although the lease is no
    longer its own: the team is told its results are lost, and jobs that run after it (after_ok) are ended,
    though every file is in place. A task that no longer holds the lease must not touch the job."""
    now = timezone.now()
    files = {"a.bin": b"a" * 1000, "b.bin": b"b" * 1000}
    job = JobFactory(team=team, state="released", end_reason="succeeded", attempt=1, delivery_state="delivering",
                     output_uri=f"file://{roots.outputs}/run", sealed_files=2, output_bytes=10_000)  # fmt: skip
    part = _sealed_part(job, attempt=1, rank=0, files=files, released_at=now, multi=False)
    told = []
    receiver = lambda sender, **kw: told.append(kw["event"])  # noqa: E731
    signals.job_event.connect(receiver, weak=False)
    real = delivery._deliver_file
    calls = []

    def stalls_once(source, target, in_transit, entry, watch):
        calls.append(entry["path"])
        # The old task, between its first and second file, silent past the reconcile delay:
        if len(calls) == 2:
            later = timezone.now() + timedelta(seconds=settings.E31_RECONCILE_AFTER_S + 5)
            delivery.deliver_part(allocation_id=part.id, now=later)  # the re-driven task, on the same node
            assert Job.objects.get(id=job.id).delivery_state == "delivered"
        return real(source, target, in_transit, entry, watch)

    monkeypatch.setattr(delivery, "_deliver_file", stalls_once)
    try:
        delivery.deliver_part(allocation_id=part.id, now=now)  # the first task
    finally:
        signals.job_event.disconnect(receiver)

    job.refresh_from_db()
    for rel, content in files.items():
        assert (roots.outputs / "run" / f"{job.id}-1" / rel).read_bytes() == content
    assert (job.delivery_state, job.delivery_detail) == ("delivered", "")
    assert "output_failed" not in told


def test_the_reconciler_does_not_redeliver_an_earlier_attempts_part_into_the_current_attempts_folder(
    roots, team
):
    """A job runs on two nodes. Its first attempt's rank 0 sealed a partial checkpoint, then rank 1's node was lost
    and the job was requeued; attempt 2 succeeded and is delivering. ``_redeliver`` picks every undelivered,
    released part of a delivering job, whatever its attempt, so it rings attempt 1's rank 0 too (again at every
    run), and that task delivers attempt 1's files into ``<job>-2/``: the folder of the attempt that succeeded
    receives files of the attempt that was lost (and, for a name both wrote, whichever lands last wins). Only the
    current attempt's parts are the job's to deliver, as ``fail_stranded`` and ``finish_delivered_jobs`` already
    hold."""
    now = timezone.now()
    long_ago = now - timedelta(hours=1)
    job = JobFactory(team=team, state="released", end_reason="succeeded", attempt=2, delivery_state="delivering",
                     output_uri=f"file://{roots.outputs}/run", sealed_files=2, output_bytes=10_000)  # fmt: skip
    lost = _sealed_part(
        job, attempt=1, rank=0, files={"partial.ckpt": b"old"}, released_at=long_ago, multi=True
    )
    Allocation.objects.create(job=job, attempt=1, rank=1, node=NodeFactory(state="down"), gpu_indices=[0],
                              rented_at=long_ago - timedelta(minutes=5), released_at=long_ago)  # fmt: skip
    current = [
        _sealed_part(job, attempt=2, rank=rank, files={"model.bin": b"new"}, released_at=long_ago, multi=True)
        for rank in (0, 1)
    ]

    findings = reconciler.reconcile(now=now)
    assert set(findings.redelivered) == {p.id for p in current}

    # What attempt 1's rank 0 node does with the message it was sent.
    delivery.deliver_part(allocation_id=lost.id, now=now)
    assert not (roots.outputs / "run" / f"{job.id}-2" / "rank0" / "partial.ckpt").exists()
