"""STAGE as a service: inputs land in the pool cache, checked, linked into the job's data dir."""

import os
import subprocess
import sys
import time

import pytest
from django.utils import timezone

from jobs import image_staging, services, sharing, snapshot, staging, transfers
from jobs.models import DataInput, DatasetCacheEntry, ImageCacheEntry, ImagePull, Job
from jobs.transfers import destinations, sources
from tests.factories import NodeFactory
from tests.staging.conftest import file_uri, make_job, write

pytestmark = pytest.mark.django_db

MB = 1024 * 1024


def stage(job: Job) -> Job:
    staging.stage_job(job_id=job.id, now=timezone.now())
    job.refresh_from_db()
    return job


def nothing_left_behind(roots, job: Job) -> None:
    assert not (roots.staging / str(job.id)).exists()
    assert not list((roots.staging / "cache").glob("*.part")) if (roots.staging / "cache").exists() else True


def test_a_file_input_is_staged_checked_and_hard_linked_into_the_job_dir(roots, team):
    path, digest = write(roots.datasets / "train.bin", os.urandom(3 * MB + 17))
    job = stage(
        make_job(team, {"name": "train", "uri": file_uri(path), "bytes": 3 * MB + 17, "sha256": digest})
    )
    assert job.state == "queued"
    data = job.inputs.get()
    assert (data.stage_state, data.bytes_done) == ("staged", 3 * MB + 17)
    assert data.rate_bytes_s > 0 and data.stage_finished_at is not None
    staged = roots.staging / str(job.id) / "train"
    entry = DatasetCacheEntry.objects.get()
    cached = roots.staging / "cache" / entry.key
    assert staged.read_bytes() == path.read_bytes()
    assert staged.stat().st_ino == cached.stat().st_ino  # a hard link: visible inside the read-only bind
    assert (entry.state, list(entry.inputs.all())) == ("ready", [data])


def test_the_staging_eta_adds_up_inputs_staged_one_after_another(team, settings):
    """A job's inputs are copied one after the other: its ETA was the longest one's alone, too soon by the rest,
    and it slid later each time an input finished."""
    settings.E31_ASSUMED_STAGE_RATE = 100 * 10**6
    job = make_job(team, {"name": "a", "uri": "file:///d/a", "bytes": 500 * 10**6},
                   {"name": "b", "uri": "file:///d/b", "bytes": 300 * 10**6}, state="staging")  # fmt: skip
    DataInput.objects.filter(job=job, name="a").update(bytes_done=100 * 10**6, rate_bytes_s=200 * 10**6)
    now = timezone.now()
    # a: 400 MB left at 200 MB/s (2 s); b: not begun, 300 MB at the assumed 100 MB/s (3 s)
    assert snapshot.staging_etas(now)[job.id] - now.timestamp() == pytest.approx(5)
    assert snapshot.staged_at([500 * 10**6, 300 * 10**6], now=now) - now.timestamp() == pytest.approx(8)


def test_the_staging_eta_the_scheduler_reads_is_now_once_inputs_are_staged(roots, team):
    path, _ = write(roots.datasets / "a.bin", b"x" * 1000)
    job = stage(make_job(team, {"name": "a", "uri": file_uri(path), "bytes": 1000}))
    now = timezone.now()
    assert snapshot.staging_etas(now)[job.id] - now.timestamp() == pytest.approx(0, abs=1e-3)


def test_a_checksum_mismatch_ends_the_job_staging_failed_unmetered_and_leaves_nothing(roots, team):
    path, _ = write(roots.datasets / "a.bin", b"abc" * 1000)
    job = stage(make_job(team, {"name": "a", "uri": file_uri(path), "bytes": 3000, "sha256": "0" * 64}))
    assert (job.state, job.end_reason) == ("ended", "staging_failed")
    assert "sha256 mismatch" in job.end_detail
    assert not job.allocations.exists()
    assert job.inputs.get().stage_state == "failed"
    assert not DatasetCacheEntry.objects.exists()
    nothing_left_behind(roots, job)


def test_a_source_smaller_than_declared_is_refused_before_any_copy(roots, team):
    path, _ = write(roots.datasets / "a.bin", b"a" * 999)
    job = stage(make_job(team, {"name": "a", "uri": file_uri(path), "bytes": 1000}))
    assert job.end_reason == "staging_failed"
    assert "the source has 999 bytes, 1000 were declared" in job.end_detail


def test_a_source_larger_than_declared_is_cut_off_and_refused(roots, team, server, private_ok):
    server.head_allowed = False  # the size is learnt only by reading: the copy must stop itself
    write(server.root / "big.bin", b"b" * (2 * MB))
    job = stage(make_job(team, {"name": "big", "uri": server.url("big.bin"), "bytes": MB}))
    assert job.end_reason == "staging_failed"
    assert "larger than the 1048576 bytes declared: cut off" in job.end_detail
    nothing_left_behind(roots, job)


def test_an_http_input_is_staged_and_verified(roots, team, server, private_ok):
    _, digest = write(server.root / "w.bin", os.urandom(MB))
    job = stage(make_job(team, {"name": "w", "uri": server.url("w.bin"), "bytes": MB, "sha256": digest}))
    assert job.state == "queued", job.end_detail
    assert (roots.staging / str(job.id) / "w").read_bytes() == (server.root / "w.bin").read_bytes()


@pytest.mark.parametrize("name", ["données.bin", "two words.bin", "redirected.bin"])
def test_an_http_input_named_outside_ascii_is_staged(roots, team, server, private_ok, name):
    """Reproduction: http://…/données.bin passed intake, then http.client refused the raw path
    (UnicodeEncodeError); no handler took it, and the job stayed in STAGING, re-driven every minute for ever.
    The path is sent percent-encoded, as a browser sends it; a redirect to such a name as well."""
    content = os.urandom(1000)
    _, digest = write(server.root / "données.bin", content)
    write(server.root / "two words.bin", content)
    server.redirects["redirected.bin"] = "/données.bin"
    job = stage(make_job(team, {"name": "n", "uri": server.url(name), "bytes": 1000, "sha256": digest}))
    assert job.state == "queued", job.end_detail
    assert (roots.staging / str(job.id) / "n").read_bytes() == content


def test_a_download_that_drops_midway_resumes_from_the_bytes_already_written(roots, team, server, private_ok):
    content = os.urandom(4 * MB)
    _, digest = write(server.root / "flaky.bin", content)
    server.drop_after["flaky.bin"] = 3 * MB
    job = stage(
        make_job(team, {"name": "f", "uri": server.url("flaky.bin"), "bytes": 4 * MB, "sha256": digest})
    )
    assert job.state == "queued", job.end_detail
    first, second = server.gets("flaky.bin")
    assert first["range"] is None and second["range"] == f"bytes={3 * MB}-"
    assert second["if_range"]  # a changed file would come back whole, never spliced
    assert server.bytes_sent == 4 * MB  # nothing was fetched twice
    assert (roots.staging / str(job.id) / "f").read_bytes() == content
    assert "1 transient error retried" in job.inputs.get().stage_detail


def test_a_resumed_download_never_splices_two_versions_of_the_file(
    roots, team, server, private_ok, monkeypatch
):
    """The server refuses HEAD (as presigned object-store URLs do) but names the version in its GET; the
    connection drops halfway and the file is replaced meanwhile by another of the same size: the resume is
    conditional on the version the first GET named, so the new file comes back whole, never half of each."""
    size = 400_000
    write(server.root / "set.bin", b"1" * size)
    server.head_allowed = False
    server.drop_after["set.bin"] = size // 2
    back_off = destinations._back_off

    def replaced_meanwhile(delay, done, progress):
        write(server.root / "set.bin", b"2" * size)
        back_off(delay, done, progress)

    monkeypatch.setattr(destinations, "_back_off", replaced_meanwhile)
    job = stage(make_job(team, {"name": "d", "uri": server.url("set.bin"), "bytes": size}))
    assert job.state == "queued", job.end_detail
    assert server.gets("set.bin")[1]["if_range"]
    assert (roots.staging / str(job.id) / "d").read_bytes() == b"2" * size


def test_a_download_without_a_version_to_check_starts_over_instead_of_resuming(
    roots, team, server, private_ok, monkeypatch
):
    """Neither HEAD nor GET names the version (no ETag, no Last-Modified): nothing would tell a changed file
    from the one begun, so after a drop the copy starts again from byte 0."""
    content = os.urandom(2 * MB)
    _, digest = write(server.root / "plain.bin", content)
    server.drop_after["plain.bin"] = MB
    monkeypatch.setattr(sources, "_validator", lambda resp: "")
    job = stage(
        make_job(team, {"name": "p", "uri": server.url("plain.bin"), "bytes": 2 * MB, "sha256": digest})
    )
    assert job.state == "queued", job.end_detail
    assert [r["range"] for r in server.gets("plain.bin")] == [None, None]
    assert (roots.staging / str(job.id) / "p").read_bytes() == content


def test_a_download_that_stalls_is_given_up_after_the_timeout_and_resumed(
    roots, team, server, private_ok, settings
):
    settings.E31_TRANSFER_TIMEOUT_S = 0.3
    content = os.urandom(2 * MB)
    _, digest = write(server.root / "slow.bin", content)
    server.stall_after["slow.bin"] = (MB, 3.0)
    job = stage(
        make_job(team, {"name": "s", "uri": server.url("slow.bin"), "bytes": 2 * MB, "sha256": digest})
    )
    assert job.state == "queued", job.end_detail
    assert [r["range"] for r in server.gets("slow.bin")] == [None, f"bytes={MB}-"]
    assert (roots.staging / str(job.id) / "s").read_bytes() == content


def test_a_source_too_slow_for_the_pools_floor_is_given_up_and_frees_its_transfer_slot(
    roots, team, server, private_ok, settings
):
    """A source that sends a little just often enough never stalls, yet a 2 MB input would take half an
    hour: it held one of the pool's few transfer slots, every team's staging waiting behind it."""
    settings.E31_TRANSFER_MIN_RATE_BPS, settings.E31_TRANSFER_MIN_RATE_WINDOW_S = 64_000, 1.0
    settings.E31_TRANSFER_RETRIES, settings.E31_TRANSFER_BACKOFF_S = 1, 0.05
    content = os.urandom(2 * MB)
    _, digest = write(server.root / "trickle.bin", content)
    server.trickle["trickle.bin"] = (100, 0.1, 6.0)  # 1 KB/s, each answer for 6 s
    began = time.monotonic()
    job = stage(
        make_job(team, {"name": "t", "uri": server.url("trickle.bin"), "bytes": 2 * MB, "sha256": digest})
    )
    assert (job.state, job.end_reason) == ("ended", "staging_failed")
    assert "under the pool's floor of 64.0 KB/s" in job.end_detail, job.end_detail
    assert time.monotonic() - began < 6.0  # two tries of about a second each, not two of the server's 6 s
    assert job.inputs.get().stage_state == "failed"
    nothing_left_behind(roots, job)


def test_a_server_that_ignores_range_is_read_again_from_the_start_and_still_verified(
    roots, team, server, private_ok
):
    content = os.urandom(2 * MB)
    _, digest = write(server.root / "norange.bin", content)
    server.drop_after["norange.bin"], server.ignore_range = MB, True
    job = stage(
        make_job(team, {"name": "n", "uri": server.url("norange.bin"), "bytes": 2 * MB, "sha256": digest})
    )
    assert job.state == "queued", job.end_detail
    assert (roots.staging / str(job.id) / "n").read_bytes() == content


def test_transient_errors_are_retried_with_backoff_but_not_found_is_final(roots, team, server, private_ok):
    write(server.root / "busy.bin", b"z" * 5000)
    server.fail_next["busy.bin"] = [503, 502]
    job = stage(make_job(team, {"name": "busy", "uri": server.url("busy.bin"), "bytes": 5000}))
    assert job.state == "queued", job.end_detail
    missing = stage(make_job(team, {"name": "gone", "uri": server.url("gone.bin"), "bytes": 5}))
    assert missing.end_reason == "staging_failed" and "HTTP 404: not found" in missing.end_detail
    assert len([r for r in server.requests if r["path"] == "gone.bin"]) == 1


def test_giving_up_after_the_configured_retries_fails_staging(roots, team, server, private_ok, settings):
    settings.E31_TRANSFER_RETRIES = 2
    write(server.root / "down.bin", b"z" * 10)
    server.fail_next["down.bin"] = [503] * 10
    job = stage(make_job(team, {"name": "d", "uri": server.url("down.bin"), "bytes": 10}))
    assert job.end_reason == "staging_failed" and "did not answer" in job.end_detail
    assert len(server.requests) == 3


def test_a_second_job_on_the_same_dataset_moves_zero_bytes_and_shows_cached(roots, team, server, private_ok):
    write(server.root / "shared.bin", os.urandom(2 * MB))
    spec = {"name": "shared", "uri": server.url("shared.bin"), "bytes": 2 * MB}
    first = stage(make_job(team, spec))
    sent = server.bytes_sent
    second = stage(make_job(team, spec, name="again"))
    assert second.state == "queued"
    assert server.bytes_sent == sent == 2 * MB  # the second job read 0 bytes of body
    data = second.inputs.get()
    assert data.stage_state == "cached" and "0 bytes moved" in data.stage_detail
    a, b = (roots.staging / str(j.id) / "shared" for j in (first, second))
    assert a.stat().st_ino == b.stat().st_ino
    assert DatasetCacheEntry.objects.get().hits == 1


def test_a_declared_sha256_alone_never_serves_another_sources_bytes(roots, team):
    """A cache hit needs the same object (team, URI, unchanged validator): another URI is read and verified."""
    one, digest = write(roots.datasets / "one.bin", b"same bytes" * 100)
    two, _ = write(roots.datasets / "copy" / "two.bin", b"same bytes" * 100)
    stage(make_job(team, {"name": "d", "uri": file_uri(one), "bytes": 1000, "sha256": digest}))
    job = stage(make_job(team, {"name": "d", "uri": file_uri(two), "bytes": 1000, "sha256": digest}))
    data = job.inputs.get()
    assert (job.state, data.stage_state, data.bytes_done) == ("queued", "staged", 1000)


def test_another_team_declaring_a_cached_sha256_gets_its_own_bytes_or_fails_never_the_cached_ones(
    roots, team, other_team
):
    """Reproduction 7: team B declared its own b.bin with team A's sha256 and received A's bytes as "cached"."""
    a_bytes, b_bytes = b"A" * 1000, b"B" * 1000
    a_path, a_digest = write(roots.datasets / "a.bin", a_bytes)
    b_path, _ = write(roots.data_root / "audio" / "b.bin", b_bytes)
    first = stage(make_job(team, {"name": "d", "uri": file_uri(a_path), "bytes": 1000, "sha256": a_digest}))
    assert (roots.staging / str(first.id) / "d").read_bytes() == a_bytes

    lying = stage(
        make_job(other_team, {"name": "d", "uri": file_uri(b_path), "bytes": 1000, "sha256": a_digest})
    )
    assert (lying.state, lying.end_reason) == ("ended", "staging_failed")
    assert "sha256 mismatch" in lying.end_detail
    assert not (roots.staging / str(lying.id) / "d").exists()
    assert DatasetCacheEntry.objects.get(inputs__job=first).hits == 0

    honest = stage(make_job(other_team, {"name": "d", "uri": file_uri(b_path), "bytes": 1000}))
    assert honest.inputs.get().stage_state == "staged"
    assert (roots.staging / str(honest.id) / "d").read_bytes() == b_bytes


def test_the_same_object_of_another_team_is_not_a_hit_either(roots, team, other_team):
    """A folder shared with two teams is read by each: a hit is for the same team's same object."""
    path, digest = write(roots.data_root / "shared" / "set.bin", b"s" * 1000)
    sharing.share_dataset(
        path=str(path.parent), team_slugs=["vision", "audio"], by="olga", now=timezone.now()
    )
    spec = {"name": "d", "uri": file_uri(path), "bytes": 1000, "sha256": digest}
    stage(make_job(team, spec))
    assert stage(make_job(team, spec, name="again")).inputs.get().stage_state == "cached"
    assert stage(make_job(other_team, spec)).inputs.get().stage_state == "staged"


def test_a_changed_source_is_copied_again_not_served_stale(roots, team):
    path, _ = write(roots.datasets / "live.bin", b"v1" * 500)
    stage(make_job(team, {"name": "d", "uri": file_uri(path), "bytes": 1000}))
    path.write_bytes(b"v2" * 500)
    os.utime(path, ns=(1, 1))  # a different mtime, as any rewrite gives
    job = stage(make_job(team, {"name": "d", "uri": file_uri(path), "bytes": 1000}))
    assert job.inputs.get().stage_state == "staged"
    assert (roots.staging / str(job.id) / "d").read_bytes() == b"v2" * 500


def test_eviction_takes_the_least_recently_used_unpinned_entry_and_never_a_pinned_one(roots, team, settings):
    settings.E31_STAGE_CACHE_BYTES = 2500
    settings.E31_STAGE_TEAM_SHARE = (
        1.0  # one team's entries fill the pool here: eviction, not the team's share
    )
    paths = {n: write(roots.datasets / f"{n}.bin", n.encode() * 1000)[0] for n in ("a", "b", "c")}
    pinned = stage(
        make_job(team, {"name": "a", "uri": file_uri(paths["a"]), "bytes": 1000})
    )  # oldest, queued
    done = stage(make_job(team, {"name": "b", "uri": file_uri(paths["b"]), "bytes": 1000}))
    Job.objects.filter(id=done.id).update(state="ended", end_reason="cancelled")
    stage(make_job(team, {"name": "c", "uri": file_uri(paths["c"]), "bytes": 1000}))
    kept = set(DatasetCacheEntry.objects.values_list("uri", flat=True))
    assert kept == {file_uri(paths["a"]), file_uri(paths["c"])}
    assert len(list((roots.staging / "cache").iterdir())) == 2
    assert (roots.staging / str(pinned.id) / "a").read_bytes() == b"a" * 1000
    assert not (roots.staging / str(done.id)).exists()  # a finished job's data dir goes too


def test_a_new_fill_does_not_evict_a_dataset_that_still_fits_beside_it(roots, team, settings):
    """A team stages A (1000 bytes), its job ends, then B (1000 bytes) on a cache of 2500: both fit, so A stays
    cached for the team's next job (the fill being made counts once, not twice)."""
    settings.E31_STAGE_CACHE_BYTES = 2500
    a, _ = write(roots.datasets / "a.bin", b"a" * 1000)
    b, _ = write(roots.datasets / "b.bin", b"b" * 1000)
    first = stage(make_job(team, {"name": "a", "uri": file_uri(a), "bytes": 1000}))
    Job.objects.filter(id=first.id).update(state="ended", end_reason="succeeded")
    assert stage(make_job(team, {"name": "b", "uri": file_uri(b), "bytes": 1000})).state == "queued"
    assert set(DatasetCacheEntry.objects.values_list("uri", flat=True)) == {file_uri(a), file_uri(b)}
    again = stage(make_job(team, {"name": "a", "uri": file_uri(a), "bytes": 1000}, name="again"))
    assert again.inputs.get().stage_state == "cached"


def test_entries_unused_past_the_retention_period_are_evicted_unless_pinned(roots, team, settings):
    settings.E31_STAGE_RETENTION_S = 3600
    old, _ = write(roots.datasets / "old.bin", b"o" * 100)
    held, _ = write(roots.datasets / "held.bin", b"h" * 100)
    ended = stage(make_job(team, {"name": "o", "uri": file_uri(old), "bytes": 100}))
    Job.objects.filter(id=ended.id).update(state="ended", end_reason="cancelled")
    stage(make_job(team, {"name": "h", "uri": file_uri(held), "bytes": 100}))
    DatasetCacheEntry.objects.update(last_used_at=timezone.now() - timezone.timedelta(hours=2))
    assert staging.sweep_cache(now=timezone.now()) == 1
    assert list(DatasetCacheEntry.objects.values_list("uri", flat=True)) == [file_uri(held)]


def test_cancel_during_staging_stops_the_copy_and_removes_partial_files(roots, team, member, monkeypatch):
    monkeypatch.setattr(transfers, "CHUNK", 64 * 1024)
    monkeypatch.setattr(transfers, "PROGRESS_EVERY_S", 0)
    path, _ = write(roots.datasets / "big.bin", os.urandom(2 * MB))
    job = make_job(team, {"name": "big", "uri": file_uri(path), "bytes": 2 * MB})
    original = staging._Watch.__call__

    def cancel_at_first_progress(self, done):
        services.cancel_job(job_id=job.id, user=member, now=timezone.now())
        return original(self, done)

    monkeypatch.setattr(staging._Watch, "__call__", cancel_at_first_progress)
    job = stage(job)
    assert (job.state, job.end_reason) == ("ended", "cancelled")
    data = job.inputs.get()
    assert data.stage_state == "cancelled" and data.bytes_done < 2 * MB
    assert not DatasetCacheEntry.objects.exists()
    assert list((roots.staging / "cache").iterdir()) == []
    nothing_left_behind(roots, job)


def test_no_more_than_the_configured_inputs_are_copied_at_once(roots, team, settings):
    settings.E31_STAGE_CONCURRENCY = 1
    now = timezone.now()
    busy = make_job(team, {"name": "a", "uri": "file:///x", "bytes": 1}, state="staging")
    Job.objects.filter(id=busy.id).update(worker_seen_at=now)
    assert staging.claim_slot(data_input_id=busy.inputs.get().id, now=now)
    other = make_job(team, {"name": "b", "uri": "file:///y", "bytes": 1}, state="staging")
    assert not staging.claim_slot(data_input_id=other.inputs.get().id, now=now)
    Job.objects.filter(id=busy.id).update(worker_seen_at=now - timezone.timedelta(hours=1))
    assert staging.claim_slot(data_input_id=other.inputs.get().id, now=now)  # a silent stager's slot is free


def test_image_pulls_and_data_copies_share_the_transfer_slots(roots, team, settings):
    """E31_STAGE_CONCURRENCY counts every copy into the pool: an image being pulled holds a slot as a
    dataset being copied does, and neither kind starts past the limit (a silent one frees its slot)."""
    settings.E31_STAGE_CONCURRENCY = 1
    now, silent = timezone.now(), timezone.now() - timezone.timedelta(hours=1)
    args = {
        "team_id": team.id,
        "reference": "registry.test/a@sha256:" + "1" * 64,
        "digest": "sha256:" + "1" * 64,
        "pull": ImagePull.objects.create(job=make_job(team, state="staging", name="pull"), reference="a"),
    }
    outcome, pulling = image_staging._try_claim(key="i" * 64, token="t1", now=now, **args)
    assert outcome == image_staging.FILL
    copier = make_job(team, {"name": "a", "uri": "file:///x", "bytes": 1}, state="staging")
    Job.objects.filter(id=copier.id).update(worker_seen_at=now)
    assert not staging.claim_slot(data_input_id=copier.inputs.get().id, now=now)  # the pull holds the slot
    ImageCacheEntry.objects.filter(id=pulling.id).update(updated_at=silent)
    assert staging.claim_slot(data_input_id=copier.inputs.get().id, now=now)
    second = {**args, "digest": "sha256:" + "2" * 64}
    outcome, entry = image_staging._try_claim(key="j" * 64, token="t2", now=now, **second)
    assert (outcome, entry) == (image_staging.SLOT, None)  # the copy holds it: no entry, no pull yet
    assert not ImageCacheEntry.objects.filter(key="j" * 64).exists()
    Job.objects.filter(id=copier.id).update(worker_seen_at=silent)
    assert image_staging._try_claim(key="j" * 64, token="t2", now=now, **second)[0] == image_staging.FILL


def test_a_stager_waits_for_another_filling_the_same_dataset_unless_it_went_silent(roots, team):
    a = make_job(team, {"name": "a", "uri": "file:///x", "bytes": 1}).inputs.get()
    b = make_job(team, {"name": "b", "uri": "file:///x", "bytes": 1}).inputs.get()
    now = timezone.now()
    outcome, _ = staging._try_claim(key="k" * 64, data_input=a, token="t1", validator="v", now=now)
    assert outcome == staging.FILL
    outcome, entry = staging._try_claim(key="k" * 64, data_input=b, token="t2", validator="v", now=now)
    assert outcome == staging.WAIT and entry.filling_input_id == a.id
    later = now + timezone.timedelta(hours=1)
    outcome, _ = staging._try_claim(key="k" * 64, data_input=b, token="t2", validator="v", now=later)
    assert outcome == staging.FILL and DatasetCacheEntry.objects.get().filler == "t2"


def test_an_s3_input_without_the_optional_extra_fails_with_a_clear_reason(roots, team, monkeypatch, settings):
    settings.E31_S3_ROOTS = ["s3://bucket"]
    monkeypatch.setitem(__import__("sys").modules, "s3fs", None)  # as if the extra were not installed
    job = stage(make_job(team, {"name": "s", "uri": f"s3://bucket/{team.slug}/key.bin", "bytes": 10}))
    assert job.end_reason == "staging_failed"
    assert "optional 's3' extra (s3fs)" in job.end_detail


def test_the_scheduler_sees_the_pool_cache_on_every_node(roots, team):
    nodes = [NodeFactory(name="n1"), NodeFactory(name="n2")]
    path, _ = write(roots.datasets / "d.bin", b"d" * 10)
    job = stage(make_job(team, {"name": "d", "uri": file_uri(path), "bytes": 10}))
    key = DatasetCacheEntry.objects.get().key
    view = snapshot.take(now=timezone.now())
    assert next(p for p in view.pending if p.job_id == job.id).datasets == {key}
    assert all(n.cached_datasets == {key} for n in view.nodes) and len(view.nodes) == len(nodes)


def test_a_restaged_job_keeps_inputs_already_in_place(roots, team):
    path, _ = write(roots.datasets / "d.bin", b"d" * 10)
    job = stage(make_job(team, {"name": "d", "uri": file_uri(path), "bytes": 10}))
    Job.objects.filter(id=job.id).update(state="submitted")
    stage(job)
    assert DataInput.objects.get(job=job).stage_state == "staged"


@pytest.mark.parametrize(("rate", "window"), [("-1", "60"), ("100000", "0")])
def test_a_floor_that_means_nothing_stops_the_console_at_start(rate, window):
    """A negative rate silently turned the floor off; a window of 0 s would drop every source at once."""
    env = {**os.environ, "E31_TRANSFER_MIN_RATE_BPS": rate, "E31_TRANSFER_MIN_RATE_WINDOW_S": window}
    started = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={**env, "DJANGO_SETTINGS_MODULE": "e31web.settings"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert started.returncode != 0 and "E31_TRANSFER_MIN_RATE_BPS is a rate of at least 0" in started.stderr
