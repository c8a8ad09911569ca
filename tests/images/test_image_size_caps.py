"""An image small to pull but huge unpacked cannot fill the staging cache.

A layer of zeros compresses to almost nothing: the pull moved a few hundred KB, umoci then wrote the
whole file, unchecked, and the cached image crowded every other team's inputs out of the cache. Now an
image whose compressed layers are more than the cache's room is refused before any layer moves, the
unpack is stopped at the image's cap (the room, and E31_IMAGE_UNPACK_RATIO times its compressed
layers) and what it wrote is removed, and a filling image counts at its cap in the room data fills see.
"""

import re
import subprocess

import pytest
from django.utils import timezone

from jobs import image_staging, imageref, staging, transfers
from jobs.models import ImageCacheEntry, ImagePull, Job
from jobs.transfers import registry
from jobs.units import format_size
from tests.factories import JobFactory, TeamFactory
from tests.images.registry import build_image, push, push_understated

pytestmark = pytest.mark.django_db

ZEROS = 400 * 10**6  # a file of zeros: ~400 KB compressed
CAP = 50 * 10**6
MB = 10**6


@pytest.fixture(scope="module")
def bomb_image(registry, tmp_path_factory) -> str:
    """tests/zeros:1: busybox and a 400 MB file of zeros in one layer, a few hundred KB to pull."""
    layout = tmp_path_factory.mktemp("bomb") / "layout"
    build_image(layout)
    bundle = layout.parent / "bundle"
    subprocess.run(["umoci", "unpack", "--rootless", "--image", f"{layout}:t", str(bundle)], check=True)
    subprocess.run(["truncate", "-s", str(ZEROS), str(bundle / "rootfs" / "zeros")], check=True)
    subprocess.run(["umoci", "repack", "--image", f"{layout}:t", str(bundle)], check=True)
    push(layout, registry, "tests/zeros:1")
    return f"{registry.host}/tests/zeros:1"


@pytest.fixture
def stage_root(settings, tmp_path, pool_registry):
    settings.E31_STAGING_ROOT = (tmp_path / "staging").resolve()
    settings.E31_TRANSFER_RETRIES = 0
    return settings.E31_STAGING_ROOT


@pytest.fixture
def removed_sizes(monkeypatch) -> list[int]:
    """The bytes of every tree the stager removes, measured just before it goes."""
    sizes, remove = [], image_staging.trees.remove_tree

    def measured(path):
        sizes.append(registry.tree_bytes(path))
        return remove(path)

    monkeypatch.setattr(image_staging.trees, "remove_tree", measured)
    return sizes


def staged(image: str, team=None) -> Job:
    job = JobFactory(team=team or TeamFactory(), state="submitted", image=image, argv=[])
    staging.stage_job(job_id=job.id, now=timezone.now())
    return Job.objects.get(id=job.id)


def nothing_left(stage_root) -> bool:
    images = stage_root / "images"
    return not ImageCacheEntry.objects.exists() and not (images.exists() and any(images.iterdir()))


def test_an_image_unpacking_past_the_caches_room_is_stopped_near_it_and_removed(
    bomb_image, stage_root, settings, removed_sizes
):
    settings.E31_STAGE_CACHE_BYTES = CAP
    settings.E31_STAGE_TEAM_SHARE = 1.0  # the pool's room binds here, not the team's share
    settings.E31_IMAGE_UNPACK_RATIO = 10_000  # the room binds here, not the ratio
    job = staged(bomb_image)
    assert (job.state, job.end_reason) == ("ended", "staging_failed"), job.end_detail
    assert "unpacks to more than" in job.end_detail and "E31_STAGE_CACHE_BYTES" in job.end_detail
    # The room left is what other teams' data sets: named as the capacity only, never as a figure of its own.
    sizes = set(re.findall(r"\d[\d.,]* [kMGT]?B\b", job.end_detail)) - {format_size(CAP)}
    pulled = ImagePull.objects.get(
        job=job
    ).bytes  # its layers as declared; the layout on disk takes a block more each
    assert sizes <= {format_size(pulled + k * 100_000) for k in range(2)}, job.end_detail
    assert job.image_pull.stage_state == "failed"
    assert not job.allocations.exists()
    written = max(removed_sizes)
    assert CAP < written < ZEROS / 4, f"stopped at {written:,} bytes, the cap is {CAP:,}"
    assert nothing_left(stage_root)


def test_an_image_unpacking_to_many_times_its_compressed_layers_is_stopped(
    bomb_image, stage_root, settings, removed_sizes
):
    job = staged(bomb_image)  # a cache of the default 200 GB: the ratio binds
    assert (job.state, job.end_reason) == ("ended", "staging_failed"), job.end_detail
    assert "unpacks to more than" in job.end_detail and "E31_IMAGE_UNPACK_RATIO" in job.end_detail
    compressed = ImagePull.objects.get(job=job).bytes
    assert compressed < 5 * MB  # busybox and the zeros, compressed
    assert max(removed_sizes) < ZEROS / 2
    assert nothing_left(stage_root)


def test_an_image_whose_layers_are_more_than_the_caches_room_is_refused_before_any_moves(
    base_image, stage_root, settings, pool_registry
):
    settings.E31_STAGE_CACHE_BYTES = 100_000  # the base image's layers are ~1 MB compressed
    before = pool_registry.blob_bytes()
    job = staged(base_image)
    assert (job.state, job.end_reason) == ("ended", "staging_failed"), job.end_detail
    assert "compressed" in job.end_detail and "E31_STAGE_CACHE_BYTES" in job.end_detail
    assert pool_registry.blob_bytes() == before
    assert nothing_left(stage_root)


def test_the_room_is_what_live_jobs_images_and_inputs_leave_unevictable_ones_free(
    base_image, stage_root, settings, registry, tmp_path
):
    """A ready image a live job runs holds its bytes; once that job ends, a sweep may take it: it frees them."""
    first = staged(base_image)
    assert first.state == "queued", first.end_detail
    held = ImagePull.objects.get(job=first).entry.bytes
    settings.E31_STAGE_CACHE_BYTES = held + 500_000  # less than the second image's ~1 MB of layers
    other = tmp_path / "other"
    build_image(other, files={"etc/other": b"another image"})
    push(other, registry, "tests/other:1")
    refused = staged(f"{registry.host}/tests/other:1")
    assert (refused.state, refused.end_reason) == ("ended", "staging_failed"), refused.end_detail
    assert "compressed" in refused.end_detail
    Job.objects.filter(id=first.id).update(state="ended", end_reason="succeeded")  # its pin is gone
    settings.E31_STAGE_CACHE_BYTES = held + 5 * MB
    second = staged(f"{registry.host}/tests/other:1")
    assert second.state == "queued", second.end_detail


def test_a_filling_image_counts_at_its_cap_and_at_its_size_once_ready(base_image, stage_root, monkeypatch):
    """Data fills count filling images at their bytes: an image filling at 0 left them room it was about to take."""
    seen, unpack = [], registry.unpack

    def watched(*args, **kwargs):
        seen.append(ImageCacheEntry.objects.get().bytes)
        return unpack(*args, **kwargs)

    monkeypatch.setattr(registry, "unpack", watched)
    job = staged(base_image)
    assert job.state == "queued", job.end_detail
    pull = ImagePull.objects.get(job=job)
    cap = (1 + image_staging.settings.E31_IMAGE_UNPACK_RATIO) * pull.bytes
    assert seen == [cap]
    assert pull.bytes < pull.entry.bytes < cap


def test_an_image_within_its_caps_is_staged_as_before(base_image, stage_root):
    job = staged(base_image)
    assert job.state == "queued", job.end_detail
    assert image_staging.rootfs(job.image_pull.entry.key).joinpath("bin", "busybox").is_file()


def test_an_image_that_sends_more_than_its_manifest_declares_is_stopped_and_removed(
    pool_registry, stage_root
):
    """Reproduction: a manifest declaring its layer as 1,000 bytes, the layer 30 MB: the room check and the caps
    took the 1,173 bytes the manifest declared, the pull wrote 31,467,977, and the unpack was then allowed 10x
    that. A pull is now held to what its manifest declares (and a little for the manifest and index skopeo
    writes beside the blobs): the stage fails, naming it, and what landed is removed."""
    push_understated(pool_registry, "tests/understated:1", layer_bytes=30 * MB, declared=1000)
    job = staged(f"{pool_registry.host}/tests/understated:1")
    assert (job.state, job.end_reason) == ("ended", "staging_failed"), job.end_detail
    assert "more than the" in job.end_detail and "manifest declares" in job.end_detail
    assert nothing_left(stage_root)


def test_a_pull_is_held_to_what_the_manifest_declares(pool_registry, tmp_path):
    push_understated(pool_registry, "tests/understated:2", layer_bytes=5 * MB, declared=1000)
    ref = imageref.parse(f"{pool_registry.host}/tests/understated:2")
    access = registry.Access(tls_verify=False)
    resolved = registry.resolve(ref, access=access)
    assert resolved.bytes < 2000  # what the room check sees
    with pytest.raises(transfers.TransferFailed, match="manifest declares"):
        registry.pull(
            ref, resolved.digest, tmp_path / "oci", access=access, progress=lambda n: True,
            limit=registry.pull_limit(resolved.bytes),
        )  # fmt: skip


def test_a_teams_images_and_inputs_take_at_most_its_share_of_the_cache(
    base_image, stage_root, settings, registry, tmp_path
):
    """An image's pull counts at its cap (up to the cache's whole room) while it lasts: one team's pulls and fills
    now take at most E31_STAGE_TEAM_SHARE of the cache, and another team's image still fits beside them."""
    team = TeamFactory()
    first = staged(base_image, team=team)
    assert first.state == "queued", first.end_detail
    held = ImagePull.objects.get(job=first).entry.bytes
    settings.E31_STAGE_TEAM_SHARE = 0.5
    settings.E31_STAGE_CACHE_BYTES = 2 * (
        held + 500_000
    )  # the team's share leaves it 500 KB: less than ~1 MB
    other = tmp_path / "other"
    build_image(other, files={"etc/other": b"another image"})
    push(other, registry, "tests/other:1")
    refused = staged(f"{registry.host}/tests/other:1", team=team)
    assert (refused.state, refused.end_reason) == ("ended", "staging_failed"), refused.end_detail
    assert "E31_STAGE_TEAM_SHARE" in refused.end_detail
    theirs = staged(f"{registry.host}/tests/other:1")  # another team: the pool's room holds it
    assert theirs.state == "queued", theirs.end_detail
