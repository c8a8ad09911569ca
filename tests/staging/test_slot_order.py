"""Jobs waiting for a transfer slot take a freed one oldest first, and the copy that frees it rings the next at once.

Whichever waiting job's retry came first took a freed slot: with many waiting, their tries up to 30 s apart, a job
could wait behind jobs submitted long after it, without bound. The order is the scheduler's first-come one
(submitted, then id), among the jobs that could take the slot: a waiter whose team holds its most, whose stager has
gone silent, or that waits to share another job's copy (which takes no slot) holds nobody back."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import cache_fill, dispatch, services, staging, tasks
from jobs.models import DataInput, DatasetCacheEntry, Job
from jobs.transfers import sources
from tests.factories import JobFactory, TeamFactory
from tests.staging.conftest import file_uri, make_job, write
from tests.staging.test_team_slots import copying, small_job, stage, waits_on

pytestmark = pytest.mark.django_db


@pytest.fixture
def one_slot(settings):
    settings.E31_STAGE_CONCURRENCY, settings.E31_STAGE_TEAM_SLOTS = 1, 1


def waiter(roots, team, name: str, minutes_ago: int) -> Job:
    """A job of the team submitted ``minutes_ago``, refused a slot by its first try: it waits off the threads."""
    job = small_job(roots, team, name)
    Job.objects.filter(id=job.id).update(submitted_at=timezone.now() - timedelta(minutes=minutes_ago))
    job = stage(job)
    assert job.state == "staging" and job.inputs.get().stage_state == "waiting"
    return job


def claim_sent(sent, job: Job) -> str:
    """The claim the job's last message carries."""
    return [options["args"][1] for _, options in sent if options["args"][0] == job.id][-1]


def try_again(sent, job: Job) -> Job:
    """The job's next try, by the last message sent for it."""
    tasks.stage_job(job.id, claim_sent(sent, job))
    job.refresh_from_db()
    return job


def detail(job: Job) -> str:
    return job.inputs.get().stage_detail


def ends(copies: list[DataInput]) -> None:
    """Slow copies end: their slots are free."""
    DataInput.objects.filter(id__in=[d.id for d in copies]).update(stage_state="staged")


def rung(sent) -> list[tuple[int, str]]:
    """The jobs staged again at once (no countdown), with the claim each message carries."""
    return [
        tuple(options["args"])
        for name, options in sent
        if name == dispatch.STAGE_JOB and len(options["args"]) == 2 and not options.get("countdown")
    ]


def test_the_job_that_waited_longest_takes_a_freed_slot_whoever_tries_first(
    roots, team, other_team, one_slot, sent
):
    held = copying(other_team, 1)
    old, mid, young = (waiter(roots, team, n, m) for n, m in (("old", 30), ("mid", 20), ("young", 10)))
    ends(held)
    young = try_again(sent, young)
    assert young.state == "staging"
    assert detail(young) == "waiting for a transfer slot: 2 jobs have waited longer"
    mid = try_again(sent, mid)
    assert (mid.state, detail(mid)) == ("staging", "waiting for a transfer slot: 1 job has waited longer")
    assert try_again(sent, old).state == "queued"
    assert try_again(sent, mid).state == "queued"


def test_a_waiter_whose_team_holds_its_most_holds_back_no_other_team(roots, team, other_team, settings, sent):
    settings.E31_STAGE_CONCURRENCY, settings.E31_STAGE_TEAM_SLOTS = 2, 1
    copying(team, 1)  # the team holds its one slot
    held = copying(TeamFactory(name="speech", slug="speech"), 1)  # and the pool's other is taken
    capped = waiter(roots, team, "capped", 30)
    mid, young = waiter(roots, other_team, "mid", 20), waiter(roots, other_team, "young", 10)
    ends(held)
    young = try_again(sent, young)
    assert detail(young) == "waiting for a transfer slot: 1 job has waited longer"  # mid's, not capped's
    assert try_again(sent, mid).state == "queued"
    capped = try_again(sent, capped)
    assert (capped.state, detail(capped)) == (
        "staging",
        "waiting for a transfer slot: your team holds 1 of the pool's 2, the most one team may",
    )
    assert try_again(sent, young).state == "queued"


def test_a_waiter_whose_stager_went_silent_holds_back_nobody(
    roots, team, other_team, one_slot, sent, settings
):
    held = copying(other_team, 1)
    silent = waiter(roots, team, "silent", 30)
    mid, young = waiter(roots, team, "mid", 20), waiter(roots, team, "young", 10)
    # Its messages were lost: the reconciler's to re-drive, once it finds the claim stale.
    gone = timezone.now() - timedelta(seconds=settings.E31_RECONCILE_AFTER_S + 1)
    Job.objects.filter(id=silent.id).update(worker_seen_at=gone)
    ends(held)
    assert detail(try_again(sent, young)) == "waiting for a transfer slot: 1 job has waited longer"
    assert try_again(sent, mid).state == "queued"


def test_jobs_that_need_no_slot_are_not_held_back_by_older_waiters(
    roots, team, other_team, one_slot, sent, monkeypatch
):
    """A job waiting to share its team's copy takes no slot, nor holds a place in the line; a cache hit goes on
    whoever waits for a slot."""
    cached = stage(small_job(roots, team, "cached"))  # its dataset is in the cache now, pinned while it lives
    assert cached.state == "queued"
    held = copying(other_team, 1)
    entry = DatasetCacheEntry.objects.create(key="k" * 64, uri="x", bytes=1, state=DatasetCacheEntry.FILLING,
                                             filler="t1", filling_input=held[0], created_at=timezone.now(),
                                             updated_at=timezone.now(), last_used_at=timezone.now())  # fmt: skip
    with monkeypatch.context() as patched:
        patched.setattr(staging, "_try_claim", lambda **kw: waits_on(entry, kw["key"]))
        sharer = waiter(roots, team, "sharer", 40)
    assert detail(sharer) == f"job #{held[0].job_id} is staging the same dataset; it will be shared"
    mid, young = waiter(roots, team, "mid", 20), waiter(roots, team, "young", 10)
    ends(held)
    hit = make_job(team, {"name": "cached", "uri": cached.inputs.get().uri, "bytes": 600}, name="hit")
    assert stage(hit).state == "queued"  # the youngest of all, and it moved no byte
    assert try_again(sent, sharer).state == "staging"  # the copy it shares is still being made
    assert detail(try_again(sent, young)) == "waiting for a transfer slot: 1 job has waited longer"
    assert try_again(sent, mid).state == "queued"


def test_a_job_on_its_way_to_a_slot_keeps_its_place_and_is_not_rung_again(
    roots, team, other_team, one_slot, sent, monkeypatch
):
    """Between the try that took its claim and the slot, a job asks its source what it holds (a network round
    trip, retried): a younger job's try then must not take the slot, nor a doorbell hand the job to a second
    stager."""
    held = copying(other_team, 1)
    old, young = waiter(roots, team, "old", 30), waiter(roots, team, "young", 10)
    ends(held)
    real, seen = sources.open_source, {}

    def meanwhile(uri, **kw):
        if "old" in uri and not seen:
            cache_fill.ring_next_in_line(timezone.now())
            seen["young"] = try_again(sent, young)
        return real(uri, **kw)

    monkeypatch.setattr(sources, "open_source", meanwhile)
    assert try_again(sent, old).state == "queued"
    assert detail(seen["young"]) == "waiting for a transfer slot: 1 job has waited longer"
    assert old.id not in [job_id for job_id, _ in rung(sent)]


def test_a_finished_copy_rings_the_job_that_waited_longest_at_once(roots, team, other_team, one_slot, sent):
    held = copying(other_team, 1)
    first, old, young = (waiter(roots, team, n, m) for n, m in (("first", 40), ("old", 30), ("young", 10)))
    ends(held)
    claims = {job.id: claim_sent(sent, job) for job in (first, old, young)}
    sent.clear()
    tasks.stage_job(first.id, claims[first.id])
    assert Job.objects.get(id=first.id).state == "queued"
    assert set(rung(sent)) == {(old.id, claims[old.id])}  # countdown 0: not at its timed try, seconds away
    sent.clear()
    tasks.stage_job(old.id, claims[old.id])  # the doorbell's message; its timed one finds the claim taken
    assert Job.objects.get(id=old.id).state == "queued"
    assert set(rung(sent)) == {(young.id, claims[young.id])}


def test_a_copy_done_rings_the_line_before_its_jobs_next_input_and_a_hit_rings_nobody(
    roots, team, other_team, one_slot, sent, monkeypatch
):
    held = copying(other_team, 1)
    old = waiter(roots, team, "old", 30)
    ends(held)
    path, _ = write(roots.datasets / "second.bin", b"s" * 200)
    two = small_job(roots, team, "two", {"name": "second", "uri": file_uri(path), "bytes": 200})
    Job.objects.filter(id=two.id).update(submitted_at=timezone.now() - timedelta(minutes=50))  # ahead of old
    rung_at_each_input = []
    stage_input = staging._stage_input

    def watched(data_input, *args, **kwargs):
        rung_at_each_input.append(set(rung(sent)))
        stage_input(data_input, *args, **kwargs)

    monkeypatch.setattr(staging, "_stage_input", watched)
    sent.clear()
    assert stage(two).state == "queued"
    claim = claim_sent(sent, old)
    # The first input's copy let the one slot go: the job that waited longest was rung before the second began.
    assert rung_at_each_input == [set(), {(old.id, claim)}]
    # Again, from the cache: both inputs hit, no slot is held or let go, and nobody is rung before the try's end.
    inputs = two.inputs.order_by("position").values("name", "uri", "bytes")
    again = make_job(team, *inputs, name="again")  # the same files, unchanged: both in the cache
    Job.objects.filter(id=again.id).update(submitted_at=timezone.now() - timedelta(minutes=45))
    rung_at_each_input.clear()
    sent.clear()
    assert stage(again).state == "queued"
    assert rung_at_each_input == [set(), set()]


def test_a_failed_copy_rings_the_next_job_too(roots, team, other_team, one_slot, sent):
    held = copying(other_team, 1)
    path, _ = write(roots.datasets / "bad.bin", b"b" * 100)
    bad = make_job(team, {"name": "bad", "uri": file_uri(path), "bytes": 100, "sha256": "0" * 64}, name="bad")
    Job.objects.filter(id=bad.id).update(submitted_at=timezone.now() - timedelta(minutes=40))
    stage(bad)
    old = waiter(roots, team, "old", 30)
    ends(held)
    claim = claim_sent(sent, old)
    tries = [options["args"][1] for _, options in sent if options["args"][0] == bad.id]
    sent.clear()
    tasks.stage_job(bad.id, tries[-1])
    assert Job.objects.get(id=bad.id).end_reason == "staging_failed"
    assert set(rung(sent)) == {(old.id, claim)}


def test_a_try_asks_the_same_queries_whether_two_or_two_thousand_jobs_wait(
    roots, team, other_team, one_slot, sent
):
    """The line is read by one indexed count under the slot lock: 2,000 waiting jobs cost each try no query more."""
    held = copying(other_team, 1)
    young = waiter(roots, team, "young", 0)
    ends(held)

    def queries_of_a_try(waiting: int) -> int:
        Job.objects.filter(name="parked").delete()
        now = timezone.now()
        JobFactory.create_batch(waiting, team=team, name="parked", state="staging", slot_wait="parked",
                                submitted_at=now - timedelta(hours=1), worker_seen_at=now)  # fmt: skip
        with CaptureQueriesContext(connection) as queries:
            try_again(sent, young)
        assert detail(young) == f"waiting for a transfer slot: {waiting:,} jobs have waited longer"
        return len(queries)

    assert queries_of_a_try(2) == queries_of_a_try(2000)


@pytest.fixture
def four_slots(settings):
    settings.E31_STAGE_CONCURRENCY, settings.E31_STAGE_TEAM_SLOTS = 4, 2


def test_free_slots_go_to_as_many_waiters_as_there_are(roots, team, other_team, four_slots, sent):
    """Found in review: a job was refused whenever any job was ahead of it in the line, however many slots were
    free, so the pool filled one slot per timed try (up to 30 s apart) where four copies could start at once."""
    held = copying(other_team, 2) + copying(TeamFactory(name="speech", slug="speech"), 2)
    waiter(roots, team, "old", 30)
    young = waiter(roots, other_team, "young", 10)
    ends(held)  # four slots free, one job ahead of it
    assert try_again(sent, young).state == "queued"


def test_a_job_ahead_of_its_own_team_keeps_the_teams_last_slot(roots, team, other_team, settings, sent):
    settings.E31_STAGE_CONCURRENCY, settings.E31_STAGE_TEAM_SLOTS = 2, 1
    held = copying(other_team, 1) + copying(TeamFactory(name="speech", slug="speech"), 1)
    old, young = waiter(roots, team, "old", 30), waiter(roots, team, "young", 10)
    ends(held)
    young = try_again(sent, young)  # two slots free, but one is its team's, and old is ahead for it
    assert (young.state, detail(young)) == ("staging", "waiting for a transfer slot: 1 job has waited longer")
    assert try_again(sent, old).state == "queued"


def test_a_try_cut_short_holds_back_one_slot_only(roots, team, other_team, four_slots, sent):
    """Found in review: a job whose try took its claim (on its way to a slot) and whose stager then died held every
    team's staging back until its claim went stale (E31_RECONCILE_AFTER_S); it keeps only the one slot it was
    going for."""
    held = copying(other_team, 2) + copying(TeamFactory(name="speech", slug="speech"), 2)
    old = waiter(roots, team, "old", 30)
    ends(held)
    Job.objects.filter(id=old.id).update(slot_wait=Job.TRYING, worker_seen_at=timezone.now())
    assert stage(small_job(roots, other_team, "fresh")).state == "queued"


def test_a_freed_slot_rings_as_many_waiters_as_slots_are_free_each_team_within_its_most(
    roots, team, other_team, settings, sent
):
    settings.E31_STAGE_CONCURRENCY, settings.E31_STAGE_TEAM_SLOTS = 3, 1
    held = copying(other_team, 1)
    for name in ("speech", "robotics"):
        held += copying(TeamFactory(name=name, slug=name), 1)
    first, second = waiter(roots, team, "first", 40), waiter(roots, team, "second", 30)
    third = waiter(roots, other_team, "third", 20)
    ends(held)
    claims = {job.id: claim_sent(sent, job) for job in (first, second, third)}
    sent.clear()
    cache_fill.ring_next_in_line(timezone.now())
    assert set(rung(sent)) == {
        (first.id, claims[first.id]),
        (third.id, claims[third.id]),
    }  # second: its team's


def test_a_cancel_of_a_staging_job_rings_the_line(roots, team, other_team, member, one_slot, sent):
    """Found in review: the first job in line cancelled, the next waited for its timed try (up to 30 s)."""
    held = copying(other_team, 1)
    old, young = waiter(roots, team, "old", 30), waiter(roots, team, "young", 10)
    ends(held)
    claim = claim_sent(sent, young)
    sent.clear()
    assert services.cancel_job(job_id=old.id, user=member, now=timezone.now())
    assert set(rung(sent)) == {(young.id, claim)}
