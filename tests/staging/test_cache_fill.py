"""The watch both caches' fills report through, and the sweep of fills that died with their worker."""

import os
import time

import pytest
from django.utils import timezone

from jobs import cache_fill, image_staging, staging, transfers
from jobs.models import DatasetCacheEntry, ImageCacheEntry, ImagePull, Job
from tests.staging.conftest import make_job

pytestmark = pytest.mark.django_db


def _data_fill(team):
    """A staging job's input, and the dataset entry it fills with token "mine"."""
    job = make_job(team, {"name": "d", "uri": "file:///d", "bytes": 10}, state="staging")
    now = timezone.now()
    entry = DatasetCacheEntry.objects.create(
        key="k" * 64,
        uri="file:///d",
        bytes=10,
        filler="mine",
        created_at=now,
        updated_at=now,
        last_used_at=now,
    )
    return staging._Watch(job.inputs.get()), entry


def _image_fill(team):
    """A staging job's image pull, and the image entry it fills with token "mine"."""
    job = make_job(team, state="staging")
    now = timezone.now()
    entry = ImageCacheEntry.objects.create(
        key="i" * 64, team=team, reference="r@sha256:x", digest="sha256:x", filler="mine",
        created_at=now, updated_at=now, last_used_at=now,
    )  # fmt: skip
    return image_staging._Beat(ImagePull.objects.create(job=job, reference="r")), entry


FILLS = [pytest.param(_data_fill, id="dataset"), pytest.param(_image_fill, id="image")]


def _holding(watch, entry):
    watch.entry_id, watch.token = entry.id, "mine"
    return watch


@pytest.mark.parametrize("fill", FILLS)
def test_progress_is_written_on_the_row_and_keeps_the_claim_fresh(fill, team):
    watch, entry = fill(team)
    watch = _holding(watch, entry)
    watch.began = time.monotonic() - 2
    assert watch(1000) is True
    row = type(watch.row).objects.get(id=watch.row.id)
    assert row.bytes_done == 1000 and 400 < row.rate_bytes_s <= 500
    assert type(entry).objects.get(id=entry.id).updated_at > entry.updated_at
    assert Job.objects.get(id=watch.row.job_id).worker_seen_at is not None


@pytest.mark.parametrize("fill", FILLS)
def test_a_fill_whose_entry_another_stager_took_over_is_told_to_stop(fill, team):
    watch, entry = fill(team)
    watch = _holding(watch, entry)
    type(entry).objects.filter(id=entry.id).update(filler="theirs")
    assert watch(10) is False and watch.stopped == "lost"


@pytest.mark.parametrize("fill", FILLS)
def test_a_fill_whose_job_left_staging_is_told_to_stop_and_a_wait_raises(fill, team, monkeypatch):
    monkeypatch.setattr(cache_fill, "WAIT_S", 0)
    watch, _ = fill(team)
    Job.objects.filter(id=watch.row.job_id).update(state="ended")
    assert watch(10) is False and watch.stopped == "cancelled"
    with pytest.raises(watch.stopped_error):
        watch.wait("another job is filling it")
    assert type(watch.row).objects.get(id=watch.row.id).stage_state == "waiting"


@pytest.mark.parametrize("fill", FILLS)
def test_a_wait_after_the_claim_was_lost_stops_the_copy(fill, team, monkeypatch):
    monkeypatch.setattr(cache_fill, "WAIT_S", 0)
    watch, entry = fill(team)
    watch = _holding(watch, entry)
    type(entry).objects.filter(id=entry.id).update(filler="theirs")
    with pytest.raises(transfers.TransferStopped):
        watch.wait("waiting for a transfer slot")


def test_only_silent_fills_parts_are_swept(team, tmp_path, settings):
    settings.E31_RECONCILE_AFTER_S = 60
    now = timezone.now()
    DatasetCacheEntry.objects.create(
        key="live", uri="file:///d", bytes=1, filler="tok", created_at=now, updated_at=now, last_used_at=now
    )
    old = time.time() - 120
    parts = {name: tmp_path / f"{name}.part" for name in ("live.tok", "dead.tok", "fresh.tok")}
    for name, part in parts.items():
        part.write_bytes(b"x")
        if name != "fresh.tok":
            os.utime(part, (old, old))
    removed = []
    cache_fill.remove_orphan_parts(tmp_path, DatasetCacheEntry, now=now, remove=removed.append)
    assert removed == [parts["dead.tok"]]  # a live claim keeps its part; a fresh part may be a fill starting


def test_a_missing_cache_folder_is_nothing_to_sweep(tmp_path):
    removed = []
    cache_fill.remove_orphan_parts(
        tmp_path / "none", DatasetCacheEntry, now=timezone.now(), remove=removed.append
    )
    assert removed == []


def test_an_image_fill_keeps_its_claim_fresh_between_unpack_steps_and_stops_once_taken_over(team):
    """Unpacking reports no progress: without a refresh a long unpack looks silent, frees its transfer
    slot to another copy and invites a takeover."""
    beat, entry = _image_fill(team)
    beat = _holding(beat, entry)
    beat.still_going()
    assert ImageCacheEntry.objects.get(id=entry.id).updated_at > entry.updated_at
    assert Job.objects.get(id=beat.row.job_id).worker_seen_at is not None  # the job's heartbeat too
    ImageCacheEntry.objects.filter(id=entry.id).update(filler="another stager")
    with pytest.raises(transfers.TransferStopped):
        beat.still_going()
    Job.objects.filter(id=beat.row.job_id).update(state="ended")  # cancelled meanwhile
    with pytest.raises(image_staging.ImageStopped):
        beat.still_going()


def test_fills_that_died_with_their_stager_are_swept_and_their_bytes_free_the_room(roots, team, settings):
    """Reproduction: a stager killed mid-fill left its FILLING row and its part for ever when nothing claimed the
    same key again (a one-off source, a cancelled job, a moved tag). The sweep counted the row's bytes as held
    and evicted every unpinned entry, sweep after sweep; here a 100-byte dataset used a moment ago."""
    settings.E31_RECONCILE_AFTER_S = 60
    settings.E31_STAGE_CACHE_BYTES = 1000
    now = timezone.now()
    dead = now - timezone.timedelta(hours=1)
    data = DatasetCacheEntry.objects.create(
        key="d" * 64, uri="file:///d", bytes=600, state=DatasetCacheEntry.FILLING, filler="gone",
        created_at=dead, updated_at=dead, last_used_at=dead,
    )  # fmt: skip
    image = ImageCacheEntry.objects.create(
        key="i" * 64, team=team, reference="r@sha256:x", digest="sha256:x", bytes=500, filler="gone",
        state=ImageCacheEntry.FILLING, created_at=dead, updated_at=dead, last_used_at=dead,
    )  # fmt: skip
    kept = DatasetCacheEntry.objects.create(
        key="r" * 64, uri="file:///r", bytes=100, state=DatasetCacheEntry.READY,
        created_at=now, updated_at=now, last_used_at=now,
    )  # fmt: skip
    staging.cache_dir().mkdir(parents=True)
    staging.cache_path(kept.key).write_bytes(b"r" * 100)
    data_part = staging.cache_dir() / f"{data.key}.gone.part"
    image_part = image_staging.images_dir() / f"{image.key}.gone.part"
    image_part.mkdir(parents=True)
    data_part.write_bytes(b"d" * 300)
    for part in (data_part, image_part):
        os.utime(part, (dead.timestamp(), dead.timestamp()))

    staging.sweep_cache(now=now)

    assert not DatasetCacheEntry.objects.filter(id=data.id).exists()
    assert not ImageCacheEntry.objects.filter(id=image.id).exists()
    assert not data_part.exists() and not image_part.exists()
    assert DatasetCacheEntry.objects.filter(id=kept.id).exists()
    assert staging.cache_path(kept.key).read_bytes() == b"r" * 100


def test_a_fill_that_keeps_its_claim_fresh_is_not_swept(roots, team, settings):
    settings.E31_RECONCILE_AFTER_S = 60
    now = timezone.now()
    live = DatasetCacheEntry.objects.create(
        key="l" * 64, uri="file:///l", bytes=10, state=DatasetCacheEntry.FILLING, filler="tok",
        created_at=now, updated_at=now - timezone.timedelta(seconds=30), last_used_at=now,
    )  # fmt: skip
    staging.sweep_cache(now=now)
    assert DatasetCacheEntry.objects.filter(id=live.id, state=DatasetCacheEntry.FILLING).exists()
