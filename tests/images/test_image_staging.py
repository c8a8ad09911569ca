"""STAGE pulls a job's image from a real registry before RENT: digest pinned, cached, refusals with the registry's answer."""

import os
import shutil
import socket
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from jobs import dispatch, image_staging, reconciler, services, staging
from jobs.models import DataInput, ImageCacheEntry, ImagePull, Job
from tests.factories import JobFactory, TeamFactory
from tests.images.registry import build_image, push

pytestmark = pytest.mark.django_db


@pytest.fixture
def stage_root(settings, tmp_path):
    settings.E31_STAGING_ROOT = (tmp_path / "staging").resolve()
    settings.E31_TRANSFER_RETRIES = 2
    settings.E31_TRANSFER_BACKOFF_S = 0.01
    settings.E31_ALLOW_PRIVATE_SOURCES = False
    settings.E31_OUTSIDE_REGISTRIES = True  # the address rules for outside registries are under test here
    return settings.E31_STAGING_ROOT


def image_job(team, image: str, **fields) -> Job:
    return JobFactory(team=team, state="submitted", image=image, argv=[], **fields)


def staged(job: Job) -> Job:
    staging.stage_job(job_id=job.id, now=timezone.now())
    return Job.objects.get(id=job.id)


def test_a_tag_is_pulled_and_unpacked_before_rent_and_the_job_records_its_digest(
    pool_registry, base_image, stage_root
):
    job = staged(image_job(TeamFactory(), base_image))
    assert job.state == "queued", job.end_detail
    assert job.allocations.count() == 0  # staged off the meter: nothing rented yet
    pull = ImagePull.objects.get(job=job)
    assert pull.digest == pool_registry.digest("tests/busybox:1")
    assert pull.stage_state == "staged" and pull.bytes_done == pull.bytes > 1_000_000
    root = image_staging.rootfs(pull.entry.key)
    assert (root / "bin" / "busybox").stat().st_size == os.stat("/bin/busybox").st_size
    assert pull.entry.config == {
        "Env": ["PATH=/bin", "GREETING=hello from the image"],
        "Entrypoint": ["/bin/sh", "-c"],
        "Cmd": ['echo "$GREETING in $(pwd) as $(id -u)"'],
        "WorkingDir": "/srv",
    }
    assert pull.entry.bytes >= pull.bytes  # the layout and the unpacked root count against the cache


def test_a_second_job_of_the_team_moves_no_layer_byte(pool_registry, base_image, stage_root):
    team = TeamFactory()
    first = staged(image_job(team, base_image))
    before = pool_registry.blob_bytes()
    second = staged(image_job(team, base_image))
    assert second.state == "queued", second.end_detail
    assert pool_registry.blob_bytes() == before  # only the tag was resolved: no blob fetched
    pull = ImagePull.objects.get(job=second)
    assert (pull.stage_state, pull.digest) == ("cached", first.image_pull.digest)
    assert "0 bytes moved" in pull.stage_detail
    assert ImageCacheEntry.objects.get().hits == 1


def test_a_pull_refused_a_slot_gives_its_thread_back_and_pulls_once_the_copy_ends(
    pool_registry, base_image, stage_root, settings, monkeypatch
):
    """While data copies hold every slot the pull waits off the stager's threads, its reason on its row, and its
    job is staged again by the message that carries its claim."""
    settings.E31_STAGE_CONCURRENCY = 1
    team = TeamFactory()
    copier = JobFactory(team=team, state="staging", worker_seen_at=timezone.now())
    copying = DataInput.objects.create(
        job=copier, position=0, name="d", uri="file:///d", bytes=1, stage_state="staging"
    )  # fmt: skip
    retries = []
    monkeypatch.setattr(dispatch, "restage_job", lambda job_id, *, claim, countdown_s: retries.append(claim))
    job = staged(image_job(team, base_image))
    pull = ImagePull.objects.get(job=job)
    assert job.state == "staging"
    assert (pull.stage_state, pull.stage_detail) == (
        "waiting",
        "waiting for a transfer slot: 1 copy at once on this pool",
    )
    assert not ImageCacheEntry.objects.exists()  # nothing claimed while it waits
    DataInput.objects.filter(id=copying.id).update(stage_state="staged")
    staging.stage_job(job_id=job.id, now=timezone.now(), resume_from=retries[0])
    job.refresh_from_db()
    assert job.state == "queued", job.end_detail
    assert len(retries) == 1  # pulled at the first try once the copy's slot was free
    assert ImagePull.objects.get(job=job).stage_state == "staged"


def test_another_team_never_runs_the_first_teams_cached_image(pool_registry, base_image, stage_root):
    staged(image_job(TeamFactory(slug="a"), base_image))
    before = pool_registry.blob_bytes()
    other = staged(image_job(TeamFactory(slug="b"), base_image))
    assert ImagePull.objects.get(job=other).stage_state == "staged"
    assert pool_registry.blob_bytes() > before  # its own pull, through its own registry access
    assert ImageCacheEntry.objects.count() == 2


def test_the_digest_is_pinned_when_the_tag_moves_on(pool_registry, base_image, stage_root, tmp_path):
    layout = tmp_path / "moving"
    build_image(layout, files={"etc/version": b"1\n"})
    old = push(layout, pool_registry, "tests/moving:stable")
    team = TeamFactory()
    job = staged(image_job(team, f"{pool_registry.host}/tests/moving:stable"))
    build_image(tmp_path / "next", files={"etc/version": b"2\n"})
    new = push(tmp_path / "next", pool_registry, "tests/moving:stable")
    assert new != old
    pull = ImagePull.objects.get(job=job)
    assert pull.digest == old
    assert (image_staging.rootfs(pull.entry.key) / "etc" / "version").read_text() == "1\n"
    later = staged(image_job(team, f"{pool_registry.host}/tests/moving:stable"))
    assert later.image_pull.digest == new


def test_a_reference_by_digest_runs_exactly_that_digest(pool_registry, base_image, stage_root):
    digest = pool_registry.digest("tests/busybox:1")
    job = staged(image_job(TeamFactory(), f"{pool_registry.host}/tests/busybox@{digest}"))
    assert job.state == "queued", job.end_detail
    assert job.image_pull.digest == digest


def test_a_missing_tag_ends_staging_failed_with_the_registrys_answer(pool_registry, base_image, stage_root):
    job = staged(image_job(TeamFactory(), f"{pool_registry.host}/tests/busybox:no-such-tag"))
    assert (job.state, job.end_reason) == ("ended", "staging_failed")
    assert "manifest unknown" in job.end_detail
    assert job.image_pull.stage_state == "failed"
    assert not job.allocations.exists()


def test_a_missing_image_ends_staging_failed_with_the_registrys_answer(pool_registry, stage_root):
    job = staged(image_job(TeamFactory(), f"{pool_registry.host}/tests/nothing-here:1"))
    assert (job.state, job.end_reason) == ("ended", "staging_failed")
    assert "unknown" in job.end_detail  # the registry's "name unknown" / "manifest unknown"


def test_a_registry_that_is_down_is_retried_then_the_job_fails_with_its_reason(settings, stage_root):
    with_closed_port = "127.0.0.1:9"  # discard: nothing listens
    settings.E31_POOL_REGISTRIES = [with_closed_port]
    job = staged(image_job(TeamFactory(), f"{with_closed_port}/tests/busybox:1"))
    assert (job.state, job.end_reason) == ("ended", "staging_failed")
    assert "after 3 tries" in job.end_detail and "connection refused" in job.end_detail


def test_an_outside_registry_is_refused_until_an_operator_allows_outside_registries(settings, stage_root):
    """skopeo follows a registry's redirects and token realms unchecked: outside registries are opt-in."""
    settings.E31_OUTSIDE_REGISTRIES = False
    job = staged(image_job(TeamFactory(), "reg.example.com/tests/busybox:1"))
    assert (job.state, job.end_reason) == ("ended", "staging_failed")
    assert "not one of the pool's registries" in job.end_detail and "E31_OUTSIDE_REGISTRIES" in job.end_detail


def test_a_registry_whose_name_does_not_resolve_this_time_ends_the_job_with_the_reason(
    monkeypatch, stage_root
):
    """A lookup that times out is Transient: it was re-driven forever in STAGING, never ending the job."""

    def timed_out(*args, **kwargs):
        raise image_staging.transfers.Transient("reg.example.com: Temporary failure in name resolution")

    monkeypatch.setattr(image_staging.sources, "checked_addresses", timed_out)
    job = staged(image_job(TeamFactory(), "reg.example.com/tests/busybox:1"))
    assert (job.state, job.end_reason) == ("ended", "staging_failed")
    assert "Temporary failure in name resolution" in job.end_detail


def test_a_registry_on_a_private_address_is_refused_unless_it_is_the_pools(
    pool_registry, base_image, settings, stage_root
):
    settings.E31_POOL_REGISTRIES = []
    before = pool_registry.blob_bytes()
    job = staged(image_job(TeamFactory(), base_image))
    assert (job.state, job.end_reason) == ("ended", "staging_failed")
    assert "private address" in job.end_detail
    assert pool_registry.blob_bytes() == before


def test_an_unpinned_image_is_evicted_past_retention_and_a_pinned_one_is_kept(
    pool_registry, base_image, stage_root, settings, tmp_path
):
    team = TeamFactory()
    done = staged(image_job(team, base_image))
    layout = tmp_path / "other"
    build_image(layout, files={"etc/other": b"x"})
    push(layout, pool_registry, "tests/other:1")
    running = staged(image_job(team, f"{pool_registry.host}/tests/other:1"))
    Job.objects.filter(id=done.id).update(state="ended", end_reason="succeeded")
    old = timezone.now() - timedelta(days=30)
    ImageCacheEntry.objects.update(last_used_at=old)
    settings.E31_STAGE_RETENTION_S = 86400
    assert staging.sweep_cache(now=timezone.now()) == 1
    kept = ImageCacheEntry.objects.get()
    assert kept.id == running.image_pull.entry_id and image_staging.rootfs(kept.key).is_dir()
    assert not image_staging.entry_dir(
        image_staging.cache_key(team_id=team.id, digest=done.image_pull.digest)
    ).exists()


def test_the_job_page_and_the_api_show_the_image_its_digest_and_its_staging(
    pool_registry, base_image, stage_root, team, member_client, member_token
):
    job = staged(image_job(team, base_image))
    digest = job.image_pull.digest
    page = member_client.get(f"/jobs/{job.id}/").content.decode()
    assert digest in page and "staged" in page
    body = member_client.get(f"/api/v1/jobs/{job.id}", HTTP_AUTHORIZATION=f"Bearer {member_token}").json()
    assert body["image"]["digest"] == digest and body["image"]["stage_state"] == "staged"
    assert body["image"]["bytes_done"] == body["image"]["bytes"] > 0
    assert body["work"]["image"] == base_image and body["work"]["argv"] == []


def test_an_image_being_pulled_shows_on_the_operators_transfers_page(operator_client):
    job = JobFactory(state="staging", image="registry.example.com/team/trainer:2", argv=[])
    ImagePull.objects.create(job=job, reference=job.image, stage_state="staging", bytes=4_000_000_000,
                             bytes_done=1_000_000_000, rate_bytes_s=100e6)  # fmt: skip
    page = operator_client.get("/jobs/transfers/").content.decode()
    assert "registry.example.com/team/trainer:2" in page and "30.0 s" in page  # 3 GB left at 100 MB/s


# --------------------------------------------------------------------------- one long unpack

UNPACK_S = 4.0  # one unpack step: longer than the reconciler's patience below


@pytest.fixture
def slow_umoci(tmp_path, monkeypatch):
    """``umoci`` on PATH that sleeps before unpacking (a many-gigabyte image's one long step), and
    leaves a file saying it has begun; the real umoci does the work."""
    folder = tmp_path / "slow-bin"
    folder.mkdir()
    began = tmp_path / "unpack-began"
    script = folder / "umoci"
    script.write_text(f'#!/bin/sh\ntouch {began}\nsleep {UNPACK_S}\nexec {shutil.which("umoci")} "$@"\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return began


def stage_in_thread(job: Job) -> threading.Thread:
    def stage() -> None:
        try:
            staging.stage_job(job_id=job.id, now=timezone.now())
        finally:
            connection.close()

    stager = threading.Thread(target=stage)
    stager.start()
    return stager


def wait_for(check, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.django_db(transaction=True)
def test_an_unpack_longer_than_the_reconcilers_patience_is_not_taken_for_a_silent_stager(
    pool_registry, base_image, stage_root, settings, slow_umoci, monkeypatch
):
    settings.E31_RECONCILE_AFTER_S = 1.5  # beats come every 0.5 s: a second of slack for a busy machine
    redriven = []
    monkeypatch.setattr(dispatch, "stage_job", lambda job_id, **_: redriven.append(job_id))
    monkeypatch.setattr(dispatch, "request_scheduler_pass", lambda: None)
    job = image_job(TeamFactory(), base_image)
    stager = stage_in_thread(job)
    wait_for(slow_umoci.exists)
    time.sleep(
        settings.E31_RECONCILE_AFTER_S + 0.8
    )  # inside the one step (4 s), past the reconciler's patience
    found = reconciler.reconcile(now=timezone.now())
    shown = ImagePull.objects.get(job=job).stage_detail
    stager.join(timeout=60)
    assert not stager.is_alive()
    assert job.id not in redriven and found.restaged == []
    assert shown.startswith("unpacking"), shown  # what the job's page says meanwhile
    assert Job.objects.get(id=job.id).state == "queued"


@pytest.mark.django_db(transaction=True)
def test_a_cancel_during_a_long_unpack_stops_it_and_leaves_nothing_behind(
    pool_registry, base_image, stage_root, slow_umoci, monkeypatch
):
    monkeypatch.setattr(dispatch, "request_scheduler_pass", lambda: None)
    job = image_job(TeamFactory(), base_image)
    stager = stage_in_thread(job)
    wait_for(slow_umoci.exists)
    cancelled_at = time.monotonic()
    assert services.cancel_job(job_id=job.id, user=None, now=timezone.now())
    stager.join(timeout=60)
    assert not stager.is_alive()
    assert time.monotonic() - cancelled_at < UNPACK_S - 1  # umoci was stopped, not waited for
    assert ImagePull.objects.get(job=job).stage_state == "cancelled"
    assert ImageCacheEntry.objects.count() == 0
    assert list(image_staging.images_dir().glob("*.part")) == []


@pytest.fixture
def trickling_registry(registry, settings):
    """The tests' registry behind a relay that passes its answers on 100 bytes every 0.1 s (1 KB/s), until the
    event it yields beside its address is set."""
    host, port = registry.host.rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", 0))
    fast, stop = threading.Event(), threading.Event()

    def relay(client: socket.socket) -> None:
        with client, socket.create_connection((host, int(port))) as upstream:
            threading.Thread(target=_pass_on, args=(client, upstream, 65536, None, stop), daemon=True).start()
            _pass_on(upstream, client, 100, fast, stop)

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=relay, args=(client,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    settings.E31_POOL_REGISTRIES = [address]
    yield address, fast
    stop.set()
    listener.close()


def _pass_on(src: socket.socket, dst: socket.socket, size: int, fast: threading.Event | None, stop) -> None:
    """Copies ``src`` to ``dst``; ``size`` bytes every 0.1 s while ``fast`` is given and not set."""
    try:
        while not stop.is_set() and (chunk := src.recv(size)):
            dst.sendall(chunk)
            if fast is not None and not fast.is_set():
                time.sleep(0.1)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def test_a_registry_slower_than_the_pools_floor_is_given_up_and_frees_its_transfer_slot(
    trickling_registry, base_image, stage_root, settings
):
    """skopeo waits on a registry that trickles for as long as it keeps sending: a 2 MB image at 1 KB/s
    held one of the pool's few transfer slots, and every team's staging behind it, for half an hour."""
    settings.E31_TRANSFER_MIN_RATE_BPS, settings.E31_TRANSFER_MIN_RATE_WINDOW_S = 64_000, 1.0
    settings.E31_TRANSFER_RETRIES = 1
    began = time.monotonic()
    address, _ = trickling_registry
    job = staged(image_job(TeamFactory(), f"{address}/tests/busybox:1"))
    assert (job.state, job.end_reason) == ("ended", "staging_failed")
    assert "under the pool's floor of 64.0 KB/s" in job.end_detail, job.end_detail
    assert time.monotonic() - began < 30
    assert not ImageCacheEntry.objects.exists()


def test_a_pull_retried_after_the_floor_leaves_no_half_written_blob_in_the_cached_image(
    trickling_registry, base_image, stage_root, settings, monkeypatch
):
    """The floor stops skopeo mid-blob; the retry pulls into the same layout, where skopeo's temporary file of the
    stopped blob stayed, counted in the cached image's bytes for good."""
    address, fast = trickling_registry
    settings.E31_TRANSFER_MIN_RATE_BPS, settings.E31_TRANSFER_MIN_RATE_WINDOW_S = 64_000, 1.5
    settings.E31_TRANSFER_RETRIES = 1
    retrying = image_staging._Beat.retrying

    def then_fast(self, tries, reason):
        fast.set()  # the registry recovers: the retry pulls at full speed into the same layout
        return retrying(self, tries, reason)

    monkeypatch.setattr(image_staging._Beat, "retrying", then_fast)
    job = staged(image_job(TeamFactory(), f"{address}/tests/busybox:1"))
    assert job.state == "queued", job.end_detail
    entry = ImagePull.objects.get(job=job).entry
    left = [p.name for p in image_staging.entry_dir(entry.key).joinpath("oci").iterdir() if p.is_file()]
    assert [name for name in left if name.startswith("oci-put-blob")] == [], left


def _sweep_before_the_pull_is_marked(monkeypatch, settings) -> list[int]:
    """A sweep of a cache over its capacity runs just after the image is found or filled, before the pull is
    marked: the moment a concurrent sweep can take it. Returns how many entries each sweep evicted."""
    mark, evicted = image_staging._mark, []

    def sweep_then_mark(*args, **kwargs):
        settings.E31_STAGE_CACHE_BYTES = 0  # over capacity: every unpinned entry goes
        evicted.append(staging.sweep_cache(now=timezone.now()))
        return mark(*args, **kwargs)

    monkeypatch.setattr(image_staging, "_mark", sweep_then_mark)
    return evicted


def test_an_image_found_in_the_cache_is_pinned_for_its_job_as_it_is_found(
    pool_registry, base_image, stage_root, settings, monkeypatch
):
    """The second job of a team hits the cached image; until its pull named the entry, no live job pinned it, so a
    sweep of a full cache could remove it between the two and the job was queued with no image to run."""
    team = TeamFactory()
    first = staged(image_job(team, base_image))
    Job.objects.filter(id=first.id).update(state="ended", end_reason="succeeded")  # its pin is gone
    evicted = _sweep_before_the_pull_is_marked(monkeypatch, settings)
    second = staged(image_job(team, base_image))
    assert evicted == [0], "the image was swept away between the hit and its pin"
    assert second.state == "queued", second.end_detail
    assert image_staging.rootfs(second.image_pull.entry.key).is_dir()


def test_an_image_just_pulled_is_pinned_for_its_job_as_it_becomes_ready(
    pool_registry, base_image, stage_root, settings, monkeypatch
):
    evicted = _sweep_before_the_pull_is_marked(monkeypatch, settings)
    job = staged(image_job(TeamFactory(), base_image))
    assert evicted == [0], "the image was swept away between its pull and its pin"
    assert job.state == "queued", job.end_detail
    assert image_staging.rootfs(job.image_pull.entry.key).is_dir()
