"""One team holds at most E31_STAGE_TEAM_SLOTS of the pool's transfer slots, and a job refused one waits off the
stager's threads: a team's slow sources no longer keep every other team's staging waiting for days."""

import html
import os
import subprocess
import sys
from datetime import datetime

import celery
import pytest
from django.urls import reverse
from django.utils import timezone

from jobs import cache_fill, dispatch, image_staging, imageref, reconciler, services, staging, tasks
from jobs.models import DataInput, DatasetCacheEntry, ImagePull, Job
from jobs.transfers import registry, sources
from tests.factories import JobFactory, TeamFactory
from tests.staging.conftest import file_uri, make_job, write

pytestmark = pytest.mark.django_db

TEAM_HOLDS_ITS_SHARE = "waiting for a transfer slot: your team holds 2 of the pool's 4, the most one team may"


@pytest.fixture
def slots(settings):
    settings.E31_STAGE_CONCURRENCY, settings.E31_STAGE_TEAM_SLOTS = 4, 2


def copying(team, count: int) -> list[DataInput]:
    """``count`` of the team's inputs being copied now (a slow source each), every one holding a slot."""
    held = []
    for i in range(count):
        job = make_job(team, {"name": "slow", "uri": f"http://slow.example/{i}", "bytes": 25 * 10**9},
                       state="staging", name=f"slow-{i}")  # fmt: skip
        Job.objects.filter(id=job.id).update(worker_seen_at=timezone.now())
        held.append(job.inputs.get())
    DataInput.objects.filter(id__in=[d.id for d in held]).update(stage_state="staging")
    return held


def small_job(roots, team, name: str = "small", *more: dict) -> Job:
    path, _ = write(roots.data_root / team.slug / f"{name}.bin", name.encode() * 100)
    return make_job(team, *more, {"name": name, "uri": file_uri(path), "bytes": len(name) * 100}, name=name)


def stage(job: Job, **resume) -> Job:
    staging.stage_job(job_id=job.id, now=timezone.now(), **resume)
    job.refresh_from_db()
    return job


def waits_on(entry: DatasetCacheEntry, key: str) -> tuple[str, DatasetCacheEntry]:
    """What ``_try_claim`` answers while another job copies ``entry``, the entry of the source's ``key``."""
    DatasetCacheEntry.objects.filter(id=entry.id).update(key=key)
    return staging.WAIT, entry


def claim_of(message) -> datetime:
    name, options = message
    assert name == dispatch.STAGE_JOB and options["countdown"] == staging.RETRY_S
    return datetime.fromisoformat(options["args"][1])


def test_a_team_holding_its_share_leaves_the_other_slots_to_another_team(roots, team, other_team, slots):
    """Four jobs of one team with 25 GB sources sent at 100 KB/s took all four slots for 69 hours: now two, and
    another team's small input is staged at once beside them."""
    slow = copying(team, 2) + [
        make_job(team, {"name": "slow", "uri": f"http://slow.example/{i}", "bytes": 25 * 10**9}, state="staging",
                 name=f"late-{i}").inputs.get() for i in (2, 3)
    ]  # fmt: skip
    DataInput.objects.filter(id__in=[d.id for d in slow[2:]]).update(stage_state="")
    Job.objects.filter(inputs__in=slow[2:]).update(worker_seen_at=timezone.now())
    now = timezone.now()
    assert [staging.claim_slot(data_input_id=d.id, now=now) for d in slow[2:]] == [False, False]
    assert cache_fill.slot_refusal(now, team_id=team.id, job_id=slow[2].job_id) == TEAM_HOLDS_ITS_SHARE
    theirs = stage(small_job(roots, other_team))
    assert theirs.state == "queued" and theirs.inputs.get().stage_state == "staged"


def test_the_pool_wide_limit_still_holds_whoever_holds_the_slots(roots, team, other_team, slots, sent):
    copying(team, 2)
    copying(other_team, 2)
    third = TeamFactory(name="speech", slug="speech")
    job = stage(small_job(roots, third))
    assert job.state == "staging"
    assert job.inputs.get().stage_detail == "waiting for a transfer slot: 4 copies at once on this pool"


def test_a_job_over_its_teams_share_gives_its_thread_back_and_is_staged_once_a_slot_frees(
    roots, team, slots, sent
):
    held = copying(team, 2)
    job = stage(small_job(roots, team))
    assert job.state == "staging"  # still its team's to stage, by nobody's thread meanwhile
    waiting = job.inputs.get()
    assert (waiting.stage_state, waiting.stage_detail) == ("waiting", TEAM_HOLDS_ITS_SHARE)
    assert not DatasetCacheEntry.objects.exists()  # its claim on the cache entry let go: nobody waits on it
    assert not list((roots.staging / "cache").glob("*.part"))
    [message] = sent
    assert claim_of(message) == job.worker_seen_at  # its claim, fresh: the reconciler leaves it alone
    assert not reconciler.to_restage(cache_fill.stale_before(timezone.now())).filter(id=job.id).exists()

    tasks.stage_job(job.id, message[1]["args"][1])  # the next try: its team still holds both slots
    assert Job.objects.get(id=job.id).state == "staging" and len(sent) == 2
    assert not DatasetCacheEntry.objects.exists()  # nothing opened, nothing claimed: it waits again

    DataInput.objects.filter(id=held[0].id).update(stage_state="staged")  # a slow copy ends
    tasks.stage_job(job.id, sent[1][1]["args"][1])
    job.refresh_from_db()
    assert job.state == "queued" and job.inputs.get().stage_state == "staged"
    assert len(sent) == 2  # no retry once staged
    assert (roots.staging / str(job.id) / "small").read_bytes() == b"small" * 100


def test_only_the_message_carrying_the_claim_stages_a_waiting_job(roots, team, slots, sent):
    """A duplicate or late message finds the claim moved on: one chain of tries per job, never a growing number."""
    copying(team, 2)
    job = stage(small_job(roots, team))
    stale = datetime.fromisoformat(sent[0][1]["args"][1]) - timezone.timedelta(seconds=1)
    assert staging.stage_job(job_id=job.id, now=timezone.now(), resume_from=stale) is False
    assert staging.stage_job(job_id=job.id, now=timezone.now()) is False  # a plain repeat: its claim is fresh
    assert len(sent) == 1


def test_a_stager_refused_a_slot_keeps_the_inputs_it_staged(roots, team, settings, sent, monkeypatch):
    """A job's inputs stage one after another: the first in place stays so while the second waits."""
    settings.E31_STAGE_CONCURRENCY, settings.E31_STAGE_TEAM_SLOTS = 2, 1
    path, _ = write(roots.datasets / "first.bin", b"f" * 100)
    job = make_job(team, {"name": "first", "uri": file_uri(path), "bytes": 100})
    path, _ = write(roots.datasets / "second.bin", b"s" * 100)
    DataInput.objects.create(job=job, position=1, name="second", uri=file_uri(path), bytes=100)
    original = staging.claim_slot

    def the_team_fills_its_slot_after_the_first(*, data_input_id, now, entry=None):
        if DataInput.objects.get(id=data_input_id).name == "second":
            copying(team, 1)
        return original(data_input_id=data_input_id, now=now, entry=entry)

    monkeypatch.setattr(staging, "claim_slot", the_team_fills_its_slot_after_the_first)
    job = stage(job)
    monkeypatch.setattr(staging, "claim_slot", original)
    states = dict(job.inputs.values_list("name", "stage_state"))
    assert (job.state, states) == ("staging", {"first": "staged", "second": "waiting"})
    DataInput.objects.filter(name="slow").update(stage_state="staged")
    job = stage(job, resume_from=claim_of(sent[0]))
    assert job.state == "queued" and set(job.inputs.values_list("stage_state", flat=True)) == {"staged"}


def test_a_job_cancelled_between_two_tries_ends_with_its_inputs_cancelled_and_its_folder_removed(
    roots, team, member, settings, sent
):
    settings.E31_STAGE_CONCURRENCY, settings.E31_STAGE_TEAM_SLOTS = 2, 1
    copying(team, 1)
    job = stage(small_job(roots, team))
    (roots.staging / str(job.id)).mkdir()  # what an input staged before the wait would have left
    assert services.cancel_job(job_id=job.id, user=member, now=timezone.now())
    job.refresh_from_db()
    assert (job.state, job.end_reason) == ("ended", "cancelled")
    assert job.inputs.get().stage_state == "cancelled"  # at once, with no stager running
    assert stage(job, resume_from=claim_of(sent[0])).state == "ended"  # the try it was promised
    assert not (roots.staging / str(job.id)).exists()
    assert len(sent) == 1  # no try after it
    assert not reconciler.to_restage(timezone.now()).filter(id=job.id).exists()


def test_image_pulls_count_toward_their_teams_share(roots, team, other_team, settings, sent):
    """An image entry is keyed by its team, and only a job of that team pulls it: its pull is its team's."""
    settings.E31_STAGE_CONCURRENCY, settings.E31_STAGE_TEAM_SLOTS = 3, 1
    now = timezone.now()
    puller = make_job(team, state="staging", name="pull")
    pull = ImagePull.objects.create(job=puller, reference="registry.test/a")
    outcome, _ = image_staging._try_claim(key="i" * 64, team_id=team.id, reference="registry.test/a@sha256:" + "1" * 64,
                                          digest="sha256:" + "1" * 64, token="t1", now=now, pull=pull)  # fmt: skip
    assert outcome == image_staging.FILL
    mine = stage(small_job(roots, team))
    assert mine.inputs.get().stage_detail == (
        "waiting for a transfer slot: your team holds 1 of the pool's 3, the most one team may"
    )
    assert stage(small_job(roots, other_team)).state == "queued"
    copying(other_team, 1)
    other_pull = ImagePull.objects.create(job=make_job(other_team, state="staging", name="p2"), reference="b")
    outcome, entry = image_staging._try_claim(key="j" * 64, team_id=other_team.id, reference="b", digest="d",
                                              token="t2", now=now, pull=other_pull)  # fmt: skip
    assert (outcome, entry) == (image_staging.SLOT, None)  # its team's data copy holds its one slot


def test_a_retry_is_sent_after_the_commit_and_no_sooner_than_its_countdown(
    monkeypatch, django_capture_on_commit_callbacks
):
    messages = []
    monkeypatch.setattr(celery.current_app, "send_task", lambda name, **kw: messages.append((name, kw)))
    claim = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        dispatch.restage_job(7, claim=claim, countdown_s=1.5)
        assert messages == []
    assert messages == [(dispatch.STAGE_JOB, {"args": (7, claim.isoformat()), "queue": dispatch.staging_queue(),
                                              "countdown": 1.5})]  # fmt: skip


def test_the_job_page_says_why_an_input_waits(roots, team, member_client, slots, sent):
    copying(team, 2)
    job = stage(small_job(roots, team))
    page = member_client.get(reverse("jobs:detail", args=[job.id]))
    assert html.escape(TEAM_HOLDS_ITS_SHARE) in page.content.decode()


def test_a_team_share_of_no_slot_or_more_than_the_pool_stops_the_console_at_start():
    env = {**os.environ, "E31_STAGE_CONCURRENCY": "4", "E31_STAGE_TEAM_SLOTS": "5"}
    started = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={**env, "DJANGO_SETTINGS_MODULE": "e31web.settings"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert started.returncode != 0 and "E31_STAGE_TEAM_SLOTS is at least 1" in started.stderr


def test_the_more_jobs_wait_the_further_apart_each_ones_tries(roots, team, slots, sent, settings):
    """Every waiting job tried again after RETRY_S: with E31_MAX_WAITING_PER_TEAM at 2,000 a team's waiting jobs
    would have asked for a slot some 1,300 times a second, a few queries each. Each job's tries are spread by how
    many jobs are staging, so the pool's tries together stay near E31_STAGE_CONCURRENCY per RETRY_S, each job's at
    most MAX_RETRY_S apart."""
    copying(team, 11)  # with the job below, 12 staging: 3 for each of the 4 slots
    stage(small_job(roots, team))
    assert sent[-1][1]["countdown"] == pytest.approx(3 * staging.RETRY_S)
    JobFactory.create_batch(200, team=team, state="staging")
    stage(small_job(roots, team, "second"))
    assert sent[-1][1]["countdown"] == min(staging.MAX_RETRY_S, settings.E31_RECONCILE_AFTER_S / 2)


def test_a_job_reading_a_dataset_another_job_is_copying_waits_off_the_threads(
    roots, team, slots, sent, monkeypatch
):
    """A team's two slow copies and three more jobs reading the same datasets took all five stager threads, each
    waiting in place for the copy to be shared: every other team's staging, cache hits too, waited behind them."""
    copier = copying(team, 1)[0]
    entry = DatasetCacheEntry.objects.create(key="k" * 64, uri="x", bytes=1, state=DatasetCacheEntry.FILLING,
                                             filler="t1", filling_input=copier, created_at=timezone.now(), updated_at=timezone.now(),
                                             last_used_at=timezone.now())  # fmt: skip
    monkeypatch.setattr(staging, "_try_claim", lambda **kw: (staging.WAIT, entry))
    job = stage(small_job(roots, team))
    waiting = job.inputs.get()
    assert job.state == "staging" and waiting.stage_state == "waiting"
    assert waiting.stage_detail == f"job #{copier.job_id} is staging the same dataset; it will be shared"
    [message] = sent
    monkeypatch.undo()
    monkeypatch.setattr(celery.current_app, "send_task", lambda name, **kw: sent.append((name, kw)))
    tasks.stage_job(job.id, message[1]["args"][1])  # the copy is done by now, or another claims it: staged
    assert Job.objects.get(id=job.id).state == "queued"


def test_a_pull_of_an_image_another_job_is_pulling_waits_off_the_threads(team, sent, monkeypatch):
    beat = image_staging._Beat(ImagePull.objects.create(job=make_job(team, state="staging"), reference="r"))
    monkeypatch.setattr(image_staging, "_try_claim", lambda **kw: (image_staging.WAIT, None))
    with pytest.raises(cache_fill.WaitsElsewhere):
        resolved = registry.Resolved(digest="sha256:" + "1" * 64, bytes=10)
        image_staging._stage_digest(
            beat.row, team.id, imageref.parse("registry.test/a:1"), resolved, None, beat
        )
    assert ImagePull.objects.values_list("stage_state", "stage_detail").get() == (
        "waiting",
        "another job is pulling the same image; it will be shared",
    )


def test_a_job_waiting_to_share_a_copy_is_not_held_back_by_its_teams_slots(
    roots, team, slots, sent, monkeypatch
):
    """Sharing a copy, or hitting it once done, takes no slot: a job waiting for another's copy goes on to the
    cache even while its team's other copies hold every slot it may take."""
    copier = copying(team, 2)[0]
    entry = DatasetCacheEntry.objects.create(key="k" * 64, uri="x", bytes=1, state=DatasetCacheEntry.FILLING,
                                             filler="t1", filling_input=copier, created_at=timezone.now(),
                                             updated_at=timezone.now(), last_used_at=timezone.now())  # fmt: skip
    job = small_job(roots, team)
    DatasetCacheEntry.objects.filter(id=entry.id).update(uri=job.inputs.get().uri)
    tries = []
    monkeypatch.setattr(staging, "_try_claim", lambda **kw: tries.append(kw) or waits_on(entry, kw["key"]))
    stage(job)
    DatasetCacheEntry.objects.filter(id=entry.id).update(state=DatasetCacheEntry.READY, filling_input=None)
    entry.inputs.add(copier)  # the copy is done: the next try hits it
    tasks.stage_job(job.id, sent[-1][1]["args"][1])
    assert len(tries) == 2, "the second try was held back by the team's slots"


def test_a_pull_waiting_to_share_an_image_keeps_the_digest_it_resolved(team, sent, monkeypatch):
    """Each try asked the registry again what the tag names (a skopeo inspect, a second or more of a stager's
    thread): the pull keeps the digest it found first, the image the job will run."""
    job = make_job(team, state="submitted", name="img")
    Job.objects.filter(id=job.id).update(image="registry.test/a:1")
    monkeypatch.setattr(image_staging, "registry_access", lambda **kw: None)
    monkeypatch.setattr(image_staging.team_secrets, "check_submitter", lambda **kw: None)
    resolves = []
    digest = "sha256:" + "1" * 64
    monkeypatch.setattr(
        registry, "resolve", lambda ref, access: resolves.append(ref) or registry.Resolved(digest, 10)
    )
    monkeypatch.setattr(image_staging, "_try_claim", lambda **kw: (image_staging.WAIT, None))
    for _ in range(2):
        with pytest.raises(cache_fill.SharedCopy):
            image_staging.stage_image(job_id=job.id)
    assert len(resolves) == 1 and ImagePull.objects.get(job=job).digest == digest


def test_another_teams_copy_of_the_same_address_does_not_make_a_waiting_job_open_its_source(
    roots, team, other_team, slots, sent, monkeypatch
):
    """Cache entries are keyed by team: another team's copy of a popular public address is nothing this job can
    share. It made every try of a job refused a slot open and probe its source, for days."""
    copying(team, 2)
    job = stage(small_job(roots, team))
    uri = job.inputs.get().uri
    for state in (DatasetCacheEntry.READY, DatasetCacheEntry.FILLING):
        DatasetCacheEntry.objects.create(key=state[0] * 64, uri=uri, bytes=1, state=state, filling_input=None,
                                         created_at=timezone.now(), updated_at=timezone.now(),
                                         last_used_at=timezone.now())  # fmt: skip
    opened = []
    monkeypatch.setattr(sources, "open_source", lambda *a, **k: opened.append(a) or pytest.fail("opened"))
    for _ in range(2):
        tasks.stage_job(job.id, sent[-1][1]["args"][1])
    assert opened == [] and Job.objects.get(id=job.id).state == "staging"


def test_a_job_sharing_its_teams_copy_waits_without_asking_its_source_until_the_copy_ends(
    roots, team, slots, sent, monkeypatch
):
    """The old wait probed its source once; a try per 1.5 s for the 69 hours of a slow copy would ask it 165,000
    times. While the team's copy of the address is still being made, a try waits again and opens nothing."""
    copier = copying(team, 1)[0]
    job = small_job(roots, team)
    entry = DatasetCacheEntry.objects.create(key="k" * 64, uri=job.inputs.get().uri, bytes=1,
                                             state=DatasetCacheEntry.FILLING, filler="t1", filling_input=copier,
                                             created_at=timezone.now(), updated_at=timezone.now(),
                                             last_used_at=timezone.now())  # fmt: skip
    with monkeypatch.context() as patched:
        patched.setattr(staging, "_try_claim", lambda **kw: waits_on(entry, kw["key"]))
        stage(job)
    opened = []
    real = sources.open_source
    monkeypatch.setattr(sources, "open_source", lambda *a, **k: opened.append(a) or real(*a, **k))
    tasks.stage_job(job.id, sent[-1][1]["args"][1])
    assert opened == [] and len(sent) == 2
    assert (
        job.inputs.get().stage_detail
        == f"job #{copier.job_id} is staging the same dataset; it will be shared"
    )
    DatasetCacheEntry.objects.filter(id=entry.id).delete()  # the copy failed, or ended: this job asks again
    tasks.stage_job(job.id, sent[-1][1]["args"][1])
    assert len(opened) == 1 and Job.objects.get(id=job.id).state == "queued"


def test_a_waiting_jobs_next_try_comes_well_before_the_reconciler_would_call_it_stale(
    roots, team, slots, sent, settings
):
    """At the cap the next try came as the claim went stale: the reconciler took the job over with a full try."""
    settings.E31_RECONCILE_AFTER_S = 6
    copying(team, 2)
    JobFactory.create_batch(200, team=team, state="staging")
    stage(small_job(roots, team))
    assert sent[-1][1]["countdown"] <= settings.E31_RECONCILE_AFTER_S / 2


def _entry(
    key: str, uri: str, state: str, *, filling_input=None, size: int = 1, filler: str = ""
) -> DatasetCacheEntry:
    now = timezone.now()
    return DatasetCacheEntry.objects.create(key=key, uri=uri, bytes=size, state=state, filling_input=filling_input,
                                            filler=filler, created_at=now, updated_at=now, last_used_at=now)  # fmt: skip


def test_the_teams_entry_of_another_version_of_the_address_is_not_one_a_waiting_job_shares(
    roots, team, slots, sent, monkeypatch
):
    """An ended job of the team read an older version of the same address (another size, another key): a job
    refused a slot took that entry for one it would hit, and opened and probed its source at every try."""
    copying(team, 2)
    job = stage(small_job(roots, team))
    uri = job.inputs.get().uri
    old = make_job(team, {"name": "small", "uri": uri, "bytes": 7}, state="ended", name="old")
    _entry("o" * 64, uri, DatasetCacheEntry.READY, size=7).inputs.add(old.inputs.get())
    opened = []
    monkeypatch.setattr(sources, "open_source", lambda *a, **k: opened.append(a) or pytest.fail("opened"))
    for _ in range(3):
        tasks.stage_job(job.id, sent[-1][1]["args"][1])
    assert opened == [] and Job.objects.get(id=job.id).state == "staging"


def test_a_copy_of_another_version_of_the_address_does_not_hold_a_waiting_job_back_once_a_slot_is_free(
    roots, team, slots, sent
):
    """A job whose team was copying the same address at another size waited for that whole copy (69 hours at the
    speed floor), though a slot was free and the copy was nothing it could share."""
    held = copying(team, 2)
    job = stage(small_job(roots, team))
    uri = job.inputs.get().uri
    DataInput.objects.filter(id=held[0].id).update(uri=uri)
    _entry("a" * 64, uri, DatasetCacheEntry.FILLING, filling_input=held[0], size=25 * 10**9, filler="t")
    DataInput.objects.filter(id=held[1].id).update(
        stage_state="staged"
    )  # the other copy ends: a slot is free
    tasks.stage_job(job.id, sent[-1][1]["args"][1])
    assert Job.objects.get(id=job.id).state == "queued"
