"""What the data cache and the image cache share while a stager fills one of their entries.

A fill holds its entry by a token (``filler``) it keeps fresh as it copies; the copy loop calls a
``FillWatch`` at most every PROGRESS_EVERY_S, which writes the bytes done and the rate on the row the
pages show (a DataInput, an ImagePull), heartbeats the job, and says stop once the job left STAGING
(cancelled) or another stager took the entry over after this one went silent.
"""

import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Q, QuerySet, Subquery
from django.utils import timezone

from jobs import dispatch, transfers
from jobs.lifecycle import State
from jobs.models import SLOT_LINE, CacheEntry, DataInput, DatasetCacheEntry, ImageCacheEntry, ImagePull, Job

WAIT_S = 0.5
SLOT_LOCK = 0x0E31_57A6  # advisory lock serialising claims of the pool's transfer slots


@contextmanager
def progress_transaction():
    """One commit per progress tick, and on PostgreSQL one that does not wait for its WAL flush.

    Progress and heartbeats are advisory: a tick lost in a crash costs nothing, while three flushed
    commits every half second measured as a third of an HTTP transfer's time on a busy disk.
    """
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
        yield


def stale_before(now: datetime) -> datetime:
    """A stager (its job's heartbeat, its claim on an entry) silent since before this has gone."""
    return now - timedelta(seconds=settings.E31_RECONCILE_AFTER_S)


# --------------------------------------------------------------------------- transfer slots


def lock_slots() -> None:
    """Inside a transaction: one claim of a transfer slot at a time (SQLite's single writer already is)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SLOT_LOCK])


class WaitsElsewhere(Exception):
    """This copy must wait, for minutes or days: its stager gives its thread back and the job is staged again
    shortly (``staging._give_back``). The stagers' few threads (E31_STAGE_CONCURRENCY + 1) are for copying."""


class NoSlot(WaitsElsewhere):
    """No transfer slot for this copy now."""


class SharedCopy(WaitsElsewhere):
    """Another job of the team is copying the same bytes into the cache: this one waits to share them."""


def held_by_team(now: datetime, *, except_input: int | None = None) -> Counter[int]:
    """Copies into the pool holding a transfer slot, by team: data inputs being copied and images being pulled
    alike, each by a stager that has not gone silent. An image entry is keyed by its team, and only a job of that
    team fills it, so the entry's team is the pulling job's."""
    inputs = DataInput.objects.filter(
        stage_state="staging", job__state=State.STAGING, job__worker_seen_at__gte=stale_before(now)
    )
    if except_input is not None:
        inputs = inputs.exclude(id=except_input)
    images = ImageCacheEntry.objects.filter(state=ImageCacheEntry.FILLING, updated_at__gte=stale_before(now))
    held = Counter(dict(inputs.order_by().values_list("job__team_id").annotate(Count("id"))))
    held.update(dict(images.order_by().values_list("team_id").annotate(Count("id"))))
    return held


def slot_refusal(now: datetime, *, team_id: int, job_id: int, except_input: int | None = None) -> str:
    """Why a copy of the team's job may not take a transfer slot now, as its team reads it; "" when it may. Fewer
    than E31_STAGE_CONCURRENCY copies hold one across the pool, fewer than E31_STAGE_TEAM_SLOTS of them the team's,
    and the jobs that have waited longer (``in_line``) leave a slot free for it: of the pool's, and of its team's.
    Call it under ``lock_slots`` to take a slot on its word."""
    pool, team = settings.E31_STAGE_CONCURRENCY, settings.E31_STAGE_TEAM_SLOTS
    held = held_by_team(now, except_input=except_input)
    if held.total() >= pool:
        return f"waiting for a transfer slot: {pool} cop{'ies' if pool > 1 else 'y'} at once on this pool"
    if held[team_id] >= team:
        return f"waiting for a transfer slot: your team holds {held[team_id]} of the pool's {pool}, the most one team may"
    ahead = _ahead_by_team(now, held, job_id)
    taking = sum(min(count, team - held[other]) for other, count in ahead.items())
    if taking >= pool - held.total() or ahead[team_id] >= team - held[team_id]:
        waited = ahead.total()
        return (
            f"waiting for a transfer slot: {waited:,} job{'s have' if waited > 1 else ' has'} waited longer"
        )
    return ""


def slot_free(now: datetime, *, team_id: int, job_id: int, except_input: int | None = None) -> bool:
    """Whether a copy of the team's job may take a transfer slot now (``slot_refusal``). Call it under
    ``lock_slots``."""
    return not slot_refusal(now, team_id=team_id, job_id=job_id, except_input=except_input)


# --------------------------------------------------------------------------- the line for a slot


def in_line(now: datetime, held: Counter[int]) -> QuerySet[Job]:
    """The jobs waiting for a transfer slot that could take a free one, first come first (the scheduler's order:
    submitted, then id). A job refused one keeps its place (``Job.slot_wait``) until it takes one; one whose team
    holds E31_STAGE_TEAM_SLOTS (``held``), or whose stager has gone silent, could not, and holds nobody back. A job
    waiting to share another's copy takes no slot and is not in the line."""
    capped = [team for team, count in held.items() if count >= settings.E31_STAGE_TEAM_SLOTS]
    return (
        Job.objects.filter(
            state=State.STAGING, slot_wait__in=SLOT_LINE, worker_seen_at__gte=stale_before(now)
        )
        .exclude(team_id__in=capped)
        .order_by("submitted_at", "id")
    )


def _ahead_by_team(now: datetime, held: Counter[int], job_id: int) -> Counter[int]:
    """The jobs ahead of this one in the line, by team: each team's take no more of the free slots than its room."""
    ahead = (
        in_line(now, held).filter(_ahead_of(job_id)).order_by().values_list("team_id").annotate(Count("id"))
    )
    return Counter(dict(ahead))


def _ahead_of(job_id: int) -> Q:
    """Submitted before the job, or at the same time with a lower id: one range of the line's index
    (``job_slot_line``). Written as an OR of the two, the planner took the index of every job's submitted_at for
    the first, and read every job ever submitted before this one."""
    submitted = Subquery(Job.objects.filter(id=job_id).order_by().values("submitted_at"))
    return Q(submitted_at__lte=submitted) & ~Q(submitted_at=submitted, id__gte=job_id)


def out_of_line(job_id: int) -> None:
    """The job takes a transfer slot, or waits to share a copy: the line moves on without it."""
    Job.objects.filter(id=job_id).exclude(slot_wait="").update(slot_wait="")


# The most jobs of the line a doorbell reads: a pool has a handful of slots, and the line's first jobs of teams
# with room take them.
RING_READS = 200


def ring_next_in_line(now: datetime) -> None:
    """A freed transfer slot's doorbell: the first jobs in the line that could take the free slots, each team's no
    more than its room, are staged again at once where they wait off the stagers' threads, by a message carrying
    their claim (their timed try then finds the claim taken).

    Rung where a copy or a pull lets its slot go (done, failed or cancelled), where a try ends and where a staging
    job is cancelled, so no slot is left idle until a job's next timed try (up to half E31_RECONCILE_AFTER_S away).
    A job whose try is on its way to a slot (TRYING) keeps its slot and is not rung: its claim is a live stager's.
    A lost ring costs only the wait for that timed try."""
    held = held_by_team(now)
    free = settings.E31_STAGE_CONCURRENCY - held.total()
    if free <= 0:
        return
    line = in_line(now, held).values_list("id", "team_id", "slot_wait", "worker_seen_at")
    for job_id, team_id, slot_wait, claim in line[:RING_READS]:
        if held[team_id] >= settings.E31_STAGE_TEAM_SLOTS:
            continue  # its team's room goes to its jobs ahead of it
        held[team_id] += 1
        if slot_wait == Job.PARKED:
            dispatch.restage_job(job_id, claim=claim, countdown_s=0)
        free -= 1
        if free == 0:
            return


def cancel_inputs(job_id: int, *, states: tuple[str, ...]) -> None:
    """A cancelled job's data inputs and image pulls in ``states`` read cancelled, with no rate left showing."""
    for rows in (DataInput.objects, ImagePull.objects):
        rows.filter(job_id=job_id, stage_state__in=states).update(stage_state="cancelled", rate_bytes_s=0)


def copying_fills(now: datetime):
    """Dataset entries being copied now: their input holds a transfer slot and its stager has not gone silent."""
    return DatasetCacheEntry.objects.filter(
        state=DatasetCacheEntry.FILLING, filling_input__stage_state="staging", filling_input__job__state=State.STAGING,
        filling_input__job__worker_seen_at__gte=stale_before(now),
    )  # fmt: skip


def team_share_bytes() -> int:
    """What one team's inputs, copies and images may hold of the staging cache at once (E31_STAGE_TEAM_SHARE)."""
    return int(settings.E31_STAGE_CACHE_BYTES * settings.E31_STAGE_TEAM_SHARE)


def transfer_floor() -> transfers.Floor | None:
    """The slowest a source may send (E31_TRANSFER_MIN_RATE_BPS over E31_TRANSFER_MIN_RATE_WINDOW_S)."""
    rate, window = settings.E31_TRANSFER_MIN_RATE_BPS, settings.E31_TRANSFER_MIN_RATE_WINDOW_S
    return transfers.Floor(bytes_per_s=rate, window_s=window) if rate > 0 else None


class FillWatch:
    """The copy loop's progress callback: records progress, notices a cancel or a lost cache claim.

    ``row`` is what the job's page shows staging (it has ``job_id``, ``bytes_done``, ``rate_bytes_s``,
    ``stage_state`` and ``stage_detail``); a subclass names the cache entries it fills and what a wait
    raises once the job has left STAGING.
    """

    entries: type[CacheEntry]
    stopped_error: type[Exception]

    def __init__(self, row) -> None:
        self.row = row
        self.began = time.monotonic()
        self.entry_id: int | None = None  # set while this stager holds an entry by ``token``
        self.token = ""
        self.stopped = ""  # why the last check said stop: "cancelled" or "lost"

    def __call__(self, done: int) -> bool:
        rate = done / max(time.monotonic() - self.began, 1e-6)
        with progress_transaction():
            self.update_row(bytes_done=done, rate_bytes_s=rate)
            return self.job_alive() and self.claim_alive()

    def update_row(self, **fields) -> None:
        type(self.row).objects.filter(id=self.row.id).update(**fields)

    def job_alive(self) -> bool:
        """Heartbeat and cancel check in one UPDATE: 0 rows means the job left STAGING."""
        alive = Job.objects.filter(id=self.row.job_id, state=State.STAGING).update(
            worker_seen_at=timezone.now()
        )
        self.stopped = "" if alive else "cancelled"
        return bool(alive)

    def claim_alive(self) -> bool:
        """Keeps the claim on the entry being filled fresh; False once another stager took it."""
        if self.entry_id and not self.entries.objects.filter(id=self.entry_id, filler=self.token).update(
            updated_at=timezone.now()
        ):
            self.stopped = "lost"
            return False
        return True

    def wait(self, detail: str) -> None:
        """Shows why the row waits, sleeps a moment, then stops if the job or the claim has gone."""
        self.update_row(stage_state="waiting", stage_detail=detail[:500])
        time.sleep(WAIT_S)
        self.still_going()

    def still_going(self) -> None:
        """Heartbeats the job and keeps the claim fresh, as a progress tick does, for a wait or a step that
        reports no progress; raises if the job was cancelled or another stager took the entry over."""
        with progress_transaction():
            if not self.job_alive():
                raise self.stopped_error()
            if not self.claim_alive():
                raise transfers.TransferStopped()


def remove_orphan_parts(
    folder: Path, entries: type[CacheEntry], *, now: datetime, remove: Callable[[Path], object]
) -> None:
    """Partial fills (``<key>.<token>.part``) that died with their worker, and their rows; a live fill keeps its
    claim fresh.

    A dead fill's row was otherwise only ever replaced by a new claim on the same key, which never comes for a
    one-off source, a cancelled job or a moved tag: it stayed FILLING for good, and its bytes, counted as held,
    made every sweep evict the unpinned entries. Rows are locked first (skipping one a claim holds), so a claim
    that took a row over meanwhile (fresh ``updated_at``) keeps it."""
    stale = stale_before(now)
    with transaction.atomic():  # locked, then deleted: a takeover waits for this and finds the row gone
        dead = entries.objects.select_for_update(skip_locked=True).filter(
            state=entries.FILLING, updated_at__lt=stale
        )
        entries.objects.filter(id__in=list(dead.values_list("id", flat=True))).delete()
    if not folder.is_dir():
        return
    cutoff = stale.timestamp()
    for part in folder.glob("*.part"):
        key, _, token = part.name.removesuffix(".part").partition(".")
        live = entries.objects.filter(key=key, filler=token, state=entries.FILLING).exists()
        if not live and part.stat().st_mtime < cutoff:
            remove(part)
