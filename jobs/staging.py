"""STAGE: puts a job's declared inputs in place before any GPU is held, off the meter.

Each input lands in the pool's cache (E31_STAGING_ROOT/cache/<key>, keyed by the team and the source
object: URI, size and validator, so a hit is never another source's bytes) and the
job's data dir (E31_STAGING_ROOT/<job_id>/<name>, bind-mounted read-only into its sandbox) holds a
hard link to it, so a later job reading the same dataset moves 0 bytes. Sizes are held to the
declaration (a larger source is cut off and refused), sha256 checked when declared; progress is
written at most every half second so the job page, the transfers page and the scheduler's
staging ETA see it. At most E31_STAGE_CONCURRENCY copies run at once across the pool, image pulls
included, and at most E31_STAGE_TEAM_SLOTS of them one team's (``cache_fill.slot_refusal``); a job refused one
gives its stager's thread back and is staged again shortly (``_give_back``). Jobs waiting for a slot take one first
come first (``cache_fill.in_line``), and each slot let go rings as many of them as slots are free
(``cache_fill.ring_next_in_line``).
"""

import hashlib
import http.client
import logging
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import Case, F, QuerySet, Value, When
from django.utils import timezone

from jobs import cache_fill, declaration, dependencies, dispatch, image_staging, selectors, sharing, transfers
from jobs.lifecycle import EndReason, State
from jobs.models import CacheEntry, DataInput, DatasetCacheEntry, ImageCacheEntry, ImagePull, Job
from jobs.transfers import destinations, sources
from jobs.transitions import transition

log = logging.getLogger(__name__)
FILLING, READY = DatasetCacheEntry.FILLING, DatasetCacheEntry.READY
HIT, FILL, WAIT = "hit", "fill", "wait"
ALIVE_STATES = selectors.ALIVE_STATES
# A job refused a transfer slot is staged again this long after its stager gave its thread back: a slot freed
# is taken within about this, and each waiting job costs a few short queries per try, as a wait's tick did. With
# more jobs staging than slots, each job's tries are spread further apart (``_retry_in``), up to MAX_RETRY_S.
RETRY_S = 1.5
MAX_RETRY_S = 60.0


class StagingFailed(Exception):
    pass


class StagingStopped(Exception):
    """The job left STAGING (cancelled) while its inputs were moving."""


def stage_job(*, job_id: int, now: datetime, resume_from: datetime | None = None) -> bool:
    """SUBMITTED -> STAGING -> QUEUED once every input is in place, else ENDED/staging_failed; never metered.

    A job still waiting for a prerequisite stays SUBMITTED: an input may be what that job writes, and read
    now it would be missing, or an older copy. A job refused a transfer slot stays STAGING and its stager returns
    (``_give_back``); ``resume_from`` is the hand-over its next try takes (``_resume``)."""
    if resume_from is not None:
        return _resume(job_id, resume_from, now)
    if dependencies.unmet([job_id]) and Job.objects.filter(id=job_id, state=State.SUBMITTED).exists():
        return False
    transition(job_id=job_id, source=State.SUBMITTED, target=State.STAGING, now=now, actor="stager",
               reason="staging inputs", worker_seen_at=now)  # fmt: skip
    if not _claim(job_id, now):
        return False
    return _stage(job_id, now)


def _stage(job_id: int, now: datetime) -> bool:
    _stage_once(job_id, now)
    # Whatever the try ended with, a slot its copy held or its place in the line may be free now.
    cache_fill.ring_next_in_line(timezone.now())
    return True


def _stage_once(job_id: int, now: datetime) -> None:
    sweep_cache(now=now)
    try:
        _stage_inputs(job_id)
    except cache_fill.WaitsElsewhere as wait:
        _give_back(job_id, in_line=isinstance(wait, cache_fill.NoSlot))  # what is refused shows why it waits
        return
    except (StagingStopped, image_staging.ImageStopped):
        _stopped(job_id)
        return
    except (StagingFailed, image_staging.ImageFailed) as exc:
        _end_failed(job_id, str(exc))
        return
    except DatabaseError:
        raise  # the database, not the job: the task's retry or the reconciler stages it again
    except Exception as exc:
        # A defect, or a fault nobody foresaw: left in STAGING, the job would be handed to a stager again and
        # again by the reconciler, failing the same way each time, with nothing said to its team.
        log.exception("staging job %s failed unexpectedly", job_id)
        DataInput.objects.filter(job_id=job_id, stage_state__in=("staging", "waiting", "")).update(
            stage_state="failed", rate_bytes_s=0
        )
        # Its type only: the message may name the platform's own paths or commands, which are not the team's.
        _end_failed(job_id, f"the stager met an unexpected error ({type(exc).__name__}); the operators have its "
                            "trace in the stager's log, and submitting the job again may work")  # fmt: skip
        return
    if transition(job_id=job_id, source=State.STAGING, target=State.QUEUED, now=timezone.now(), actor="stager",
                  reason="every input staged"):  # fmt: skip
        dispatch.request_scheduler_pass()


def _stage_inputs(job_id: int) -> None:
    if Job.objects.filter(id=job_id).exclude(image="").exists():
        image_staging.stage_image(job_id=job_id)  # first: a missing image ends the job before any data moves
        # The pull may have let its slot go: the next in line need not wait for this job's copies.
        cache_fill.ring_next_in_line(timezone.now())
    slug, output_uri = Job.objects.values_list("team__slug", "output_uri").get(id=job_id)
    roots, withheld = sharing.readable_roots(slug), sharing.withheld(slug)
    s3_prefixes = sharing.s3_prefixes(slug)
    _check_s3_destination(output_uri, s3_prefixes)
    for data_input in DataInput.objects.filter(job_id=job_id).select_related("job"):
        _stage_input(data_input, roots, s3_prefixes, withheld)


def _stopped(job_id: int) -> None:
    """The job left STAGING (cancelled) during a try or between two: its partial files go with it."""
    remove_staged(job_id)
    cache_fill.cancel_inputs(job_id, states=("staging", "waiting"))


# --------------------------------------------------------------------------- waiting for a slot, off the threads


def _give_back(job_id: int, *, in_line: bool) -> None:
    """Returns the stager's thread while the job waits, for a transfer slot (``in_line``) or to share another job's
    copy, and has the job staged again in RETRY_S, by the message that carries its claim.

    Waiting in the thread, as it once did, a team's jobs refused a slot took every thread of the staging workers
    (E31_STAGE_CONCURRENCY + 1), so every other team's staging, cache hits included, waited behind them. The claim
    (``worker_seen_at``) stays on the job, fresh: the reconciler leaves it alone while it is, and re-drives it
    once stale should the message be lost. Its inputs already in place stay so (``_already_in_place``).

    A job refused a slot is parked in the line for one (``Job.slot_wait``), in the same update as its claim, so a
    doorbell never reads the claim of a live stager: it keeps its place, first come first, until it takes one."""
    claim = timezone.now()
    parked = Job.PARKED if in_line else ""
    if Job.objects.filter(id=job_id, state=State.STAGING).update(worker_seen_at=claim, slot_wait=parked):
        dispatch.restage_job(job_id, claim=claim, countdown_s=_retry_in())
    else:
        _stopped(job_id)  # cancelled as it gave its thread back


def _resume(job_id: int, claim: datetime, now: datetime) -> bool:
    """The try after a give-back. Only the message that carries the job's claim takes it, so one chain of tries
    goes on per job; a message late past the claim's staleness finds the reconciler's stager has it.

    A try that finds nothing changed waits again before any source or registry is asked or the cache swept, at
    about the cost of a tick of the old wait: while the team's copy it shares is still being made, or while its team
    is refused a slot. Sharing a copy, or hitting it once done, takes no slot: a job whose team's cache now holds
    what it reads goes on whatever its team's copies hold. The claim taken and the wait again commit as one."""
    with transaction.atomic():
        taken = Job.objects.filter(id=job_id, state=State.STAGING, worker_seen_at=claim).update(
            worker_seen_at=now, slot_wait=_on_its_way()
        )
        waits = bool(taken) and _waits_again(job_id, now)
    if not taken:
        if not Job.objects.filter(id=job_id, state__in=ALIVE_STATES).exists():
            _stopped(job_id)  # cancelled between two tries
        return False
    return waits or _stage(job_id, now)


def _waits_again(job_id: int, now: datetime) -> bool:
    """Whether the job, its claim just taken, still waits: to share the copy its team is still making, or for a
    slot it is refused. It then gives the thread back again, in the line for a slot or out of it."""
    team_id, image = Job.objects.values_list("team_id", "image").get(id=job_id)
    entries = _waited_on(job_id, team_id)
    if _still_copied(entries, now):
        _give_back(job_id, in_line=False)
        return True
    if not _ready(entries) and (why := cache_fill.slot_refusal(now, team_id=team_id, job_id=job_id)):
        _show_wait(job_id, why, image=bool(image))
        _give_back(job_id, in_line=True)
        return True
    return False


def _on_its_way() -> Case:
    """A try takes the claim of a job parked in the line: the job keeps its place while the try goes for a slot
    (its source probed, its cache entry claimed), so a younger job's try meanwhile does not take it, nor a doorbell
    hand the job to a second stager."""
    return Case(When(slot_wait=Job.PARKED, then=Value(Job.TRYING)), default=F("slot_wait"))


def _waited_on(job_id: int, team_id: int) -> list[QuerySet]:
    """The cache entries a waiting job's input or pull would share, or hit once filled: each by the key its last
    try found (a key holds the team, the source's address, size and validator, or the image's digest)."""
    keys = DataInput.objects.filter(job_id=job_id, stage_state="waiting").exclude(waiting_key="")
    digests = ImagePull.objects.filter(job_id=job_id, stage_state="waiting").exclude(digest="")
    images = [
        image_staging.cache_key(team_id=team_id, digest=d) for d in digests.values_list("digest", flat=True)
    ]
    return [
        DatasetCacheEntry.objects.filter(key__in=keys.values("waiting_key")),
        ImageCacheEntry.objects.filter(key__in=images),
    ]


def _still_copied(entries: list[QuerySet], now: datetime) -> bool:
    """Whether another job's copy is still filling one of ``entries`` (its filler heard from lately)."""
    stale = cache_fill.stale_before(now)
    return any(e.filter(state=CacheEntry.FILLING, updated_at__gte=stale).exists() for e in entries)


def _ready(entries: list[QuerySet]) -> bool:
    return any(e.filter(state=CacheEntry.READY).exists() for e in entries)


def _retry_in() -> float:
    """When a waiting job tries again: RETRY_S, spread by the jobs staging per slot, so that the pool's tries
    together stay near E31_STAGE_CONCURRENCY per RETRY_S (a team may have 2,000 jobs waiting), until each job's
    come half E31_RECONCILE_AFTER_S apart."""
    per_slot = Job.objects.filter(state=State.STAGING).count() / settings.E31_STAGE_CONCURRENCY
    # Before the job's claim goes stale: else the reconciler would take the job over with a full try.
    most = max(RETRY_S, min(MAX_RETRY_S, settings.E31_RECONCILE_AFTER_S / 2))
    return min(most, RETRY_S * max(1.0, per_slot))


def _show_wait(job_id: int, why: str, *, image: bool) -> None:
    """The reason on what waits (a slot held by the team rather than the pool's all taken, or the count changed)."""
    for rows in (DataInput.objects, ImagePull.objects) if image else (DataInput.objects,):
        rows.filter(job_id=job_id, stage_state="waiting").exclude(stage_detail=why).update(
            stage_detail=why[:500]
        )


def _end_failed(job_id: int, why: str) -> None:
    remove_staged(job_id)
    transition(job_id=job_id, source=State.STAGING, target=State.ENDED, now=timezone.now(), actor="stager",
               end_reason=EndReason.STAGING_FAILED, reason=why[:300], end_detail=why[:500])  # fmt: skip


def _check_s3_destination(output_uri: str, s3_prefixes: list[str]) -> None:
    """An s3:// destination outside the team's prefixes of the S3 roots configured now ends the job here,
    before it holds GPUs, instead of after its run at delivery (a job submitted before the roots changed)."""
    if urlsplit(output_uri).scheme == "s3":
        try:
            declaration.check_s3_under(output_uri, s3_prefixes)
        except declaration.OutsideTeamPrefix as exc:
            raise StagingFailed(f"output.uri: {exc}") from exc


def _claim(job_id: int, now: datetime) -> bool:
    """One stager at a time: the one that just moved it, or a retry after the last went silent."""
    fresh = Job.objects.filter(id=job_id, state=State.STAGING, worker_seen_at=now).exists()
    return fresh or bool(
        Job.objects.filter(
            id=job_id, state=State.STAGING, worker_seen_at__lt=cache_fill.stale_before(now)
        ).update(worker_seen_at=now, slot_wait=_on_its_way())
    )


def job_dir(job_id: int) -> Path:
    return settings.E31_STAGING_ROOT / str(job_id)


def cache_dir() -> Path:
    return settings.E31_STAGING_ROOT / "cache"


def cache_path(key: str) -> Path:
    return cache_dir() / key


def remove_staged(job_id: int) -> None:
    shutil.rmtree(job_dir(job_id), ignore_errors=True)


# --------------------------------------------------------------------------- one input


class _Watch(cache_fill.FillWatch):
    """A data input's copy: its DataInput shows the progress; it fills a dataset cache entry."""

    entries = DatasetCacheEntry
    stopped_error = StagingStopped


def _stage_input(
    data_input: DataInput, roots: list[Path], s3_prefixes: list[str], withheld: Sequence[Path] = ()
) -> None:
    """``roots`` and ``s3_prefixes``: where the job's team may read file:// and s3:// sources, checked
    again here as the source is opened (the operator's roots may have changed since intake); ``withheld``:
    shared folders within its roots it may not read (``sharing.withheld``)."""
    if _already_in_place(data_input):
        return  # a re-driven stager after a takeover: this input was finished before
    source = None
    try:
        source = sources.open_source(
            data_input.uri, roots=roots, s3_prefixes=s3_prefixes, allow_private=settings.E31_ALLOW_PRIVATE_SOURCES,
            allow_hardlinks=settings.E31_ALLOW_HARDLINKED_SOURCES, timeout=settings.E31_TRANSFER_TIMEOUT_S,
        )  # fmt: skip
        _stage_from(source, data_input, withheld)
    except transfers.TransferFailed as exc:
        _fail(data_input, str(exc))
    finally:
        if source is not None:
            source.close()


def _already_in_place(data_input: DataInput) -> bool:
    target = job_dir(data_input.job_id) / data_input.name
    return (
        data_input.stage_state in ("staged", "cached")
        and target.is_file()
        and (target.stat().st_size == data_input.bytes)
    )


def _stage_from(source, data_input: DataInput, withheld: Sequence[Path] = ()) -> None:
    watch = _Watch(data_input)
    info = _probe(source, watch)
    _check_not_withheld(source, withheld)
    if info.size is not None and info.size != data_input.bytes:
        _fail(data_input, f"the source has {info.size} bytes, {data_input.bytes} were declared")
    key = cache_key(
        team_id=data_input.job.team_id, uri=data_input.uri, size=data_input.bytes, validator=info.validator,
        sha256=data_input.sha256,
    )  # fmt: skip
    while True:
        outcome, entry, token = _claim_entry(key, data_input, watch, info.validator)
        if outcome == HIT:
            _link(key, data_input)
            _mark_cached(data_input)
            return
        try:
            copied = _fill(entry, token, source, data_input, watch)
        except transfers.TransferStopped:
            if watch.stopped == "cancelled":
                raise StagingStopped() from None
            watch.entry_id = None
            continue  # another stager took the entry over: wait for it, or hit what it filled
        _link(key, data_input)
        _mark_staged(data_input, copied, watch)
        # Its slot is free: the next in line need not wait for this job's other inputs. A hit held none.
        cache_fill.ring_next_in_line(timezone.now())
        return


def _probe(source, watch: _Watch) -> transfers.SourceInfo:
    """The source's size and validator, retrying transient errors as the copy does."""
    for attempt in range(settings.E31_TRANSFER_RETRIES + 1):
        try:
            return source.probe()
        except (transfers.Transient, OSError, http.client.HTTPException) as exc:
            if attempt == settings.E31_TRANSFER_RETRIES:
                raise transfers.TransferFailed(f"the source did not answer: {exc}") from exc
            time.sleep(min(transfers.MAX_BACKOFF_S, settings.E31_TRANSFER_BACKOFF_S * 2**attempt))
            if not watch.job_alive():
                raise StagingStopped() from exc
    raise AssertionError("unreachable")


def _check_not_withheld(source, withheld: Sequence[Path]) -> None:
    """A file opened (probed) under the team's own folder but in a folder shared with other teams only is
    refused: the kernel's name for the open file is checked, so a link swapped in after any path check
    cannot reach it."""
    opened = getattr(source, "_file", None) if isinstance(source, sources.FileSource) else None
    if opened is None or not withheld:
        return
    try:
        real = Path(os.readlink(f"/proc/self/fd/{opened.fileno()}"))
    except OSError:  # no /proc: the path as it resolves now
        real = Path(os.path.realpath(source.path))
    if any(real == folder or real.is_relative_to(folder) for folder in withheld):
        raise transfers.TransferFailed(
            "the file lies in a folder an operator shared with other teams, not with this one"
        )


def cache_key(*, team_id: int, uri: str, size: int, validator: str, sha256: str) -> str:
    """The same object read by the same team: its URI, size and validator unchanged, and the same declared sha256.

    A declared sha256 alone is never a key: another team (or another URI) declaring it must not
    receive bytes its own source does not hold, so its source is read and verified like any other.
    """
    if validator:
        basis = f"source:{team_id}\n{uri}\n{size}\n{validator}\n{sha256}"
    else:
        basis = f"once:{uuid.uuid4().hex}"  # nothing proves two reads give the same bytes: never shared
    return hashlib.sha256(basis.encode()).hexdigest()


def _claim_entry(key: str, data_input: DataInput, watch: _Watch, validator: str):
    token = uuid.uuid4().hex
    while True:
        outcome, entry = _try_claim(key=key, data_input=data_input, token=token, validator=validator,
                                    now=timezone.now())  # fmt: skip
        if outcome != WAIT:
            return outcome, entry, token
        other = entry.filling_input.job_id if entry and entry.filling_input else None
        if other is None:
            watch.wait("retrying the cache")  # a claim made a moment ago: its entry is there at the next look
            continue
        why = f"job #{other} is staging the same dataset; it will be shared"
        watch.update_row(stage_state="waiting", stage_detail=why, waiting_key=key)
        raise cache_fill.SharedCopy(why)


@transaction.atomic
def _try_claim(*, key: str, data_input: DataInput, token: str, validator: str, now: datetime):
    """HIT (pinned for this input), FILL (this transfer fills it) or WAIT (another is filling it)."""
    entry = (
        DatasetCacheEntry.objects.select_for_update(of=("self",))
        .filter(key=key)
        .select_related("filling_input")
        .first()
    )
    if entry is None:
        try:
            with transaction.atomic():
                return FILL, DatasetCacheEntry.objects.create(
                    key=key, uri=data_input.uri, bytes=data_input.bytes, sha256=data_input.sha256,
                    validator=validator[:300], state=FILLING, filler=token, filling_input=data_input,
                    created_at=now, updated_at=now, last_used_at=now,
                )  # fmt: skip
        except IntegrityError:
            return WAIT, None  # another stager created it a moment ago
    if entry.state == READY and _cache_file_ok(entry):
        entry.inputs.add(data_input)
        DatasetCacheEntry.objects.filter(id=entry.id).update(hits=entry.hits + 1, last_used_at=now)
        return HIT, entry
    if entry.state == READY or entry.updated_at < cache_fill.stale_before(now):
        # Its file is gone, or its filler went silent: this transfer fills it afresh.
        DatasetCacheEntry.objects.filter(id=entry.id).update(
            state=FILLING, filler=token, filling_input=data_input, updated_at=now
        )
        return FILL, entry
    return WAIT, entry


def _cache_file_ok(entry: DatasetCacheEntry) -> bool:
    try:
        return cache_path(entry.key).stat().st_size == entry.bytes
    except OSError:
        return False


def _fill(entry: DatasetCacheEntry, token: str, source, data_input: DataInput, watch: _Watch):
    watch.entry_id, watch.token = entry.id, token  # waits and progress keep the claim fresh
    part = cache_dir() / f"{entry.key}.{token}.part"
    try:
        _acquire_slot(data_input, watch, entry)
        watch.began = time.monotonic()
        sweep_cache(now=timezone.now())  # the claimed entry's row already counts this fill's bytes
        cache_dir().mkdir(parents=True, exist_ok=True)
        copied = destinations.copy(
            source, part, limit=data_input.bytes, want_sha256=bool(data_input.sha256), progress=watch,
            retries=settings.E31_TRANSFER_RETRIES, backoff_s=settings.E31_TRANSFER_BACKOFF_S, floor=cache_fill.transfer_floor(),
        )  # fmt: skip
        _verify(data_input, copied)
        os.chmod(part, 0o444)  # the jobs that link to it read it; nobody writes it again
        os.replace(part, cache_path(entry.key))
    except BaseException:
        part.unlink(missing_ok=True)
        DatasetCacheEntry.objects.filter(id=entry.id, filler=token).delete()
        raise
    _publish(entry, token, data_input)
    return copied


def _verify(data_input: DataInput, copied: transfers.Copied) -> None:
    if copied.bytes != data_input.bytes:
        raise transfers.TransferFailed(f"{copied.bytes} bytes arrived, {data_input.bytes} were declared")
    if data_input.sha256 and copied.sha256 != data_input.sha256:
        raise transfers.TransferFailed(
            f"sha256 mismatch: got {copied.sha256[:12]}…, declared {data_input.sha256[:12]}…"
        )


@transaction.atomic
def _publish(entry: DatasetCacheEntry, token: str, data_input: DataInput) -> None:
    now = timezone.now()
    DatasetCacheEntry.objects.filter(id=entry.id, filler=token).update(
        state=READY, filler="", filling_input=None, updated_at=now, last_used_at=now
    )
    entry.inputs.add(data_input)


def _link(key: str, data_input: DataInput) -> None:
    """The job's data dir gets a hard link: inside the read-only bind it needs no path outside it."""
    target = job_dir(data_input.job_id) / data_input.name
    tmp = target.with_name(f".{data_input.name}.{uuid.uuid4().hex[:8]}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(cache_path(key), tmp)
        except OSError:  # another filesystem, or links not allowed: a copy is slower but just as correct
            shutil.copyfile(cache_path(key), tmp)
        os.replace(tmp, target)
    except OSError as exc:  # a full or read-only disk on this node
        raise transfers.TransferFailed(
            f"the staged copy could not be put in the job's folder: {exc}"
        ) from exc


def _mark_cached(data_input: DataInput) -> None:
    now = timezone.now()
    DataInput.objects.filter(id=data_input.id).update(
        stage_state="cached", bytes_done=data_input.bytes, rate_bytes_s=0, stage_started_at=now,
        stage_finished_at=now, stage_detail="served from the pool cache: 0 bytes moved",
    )  # fmt: skip


def _mark_staged(data_input: DataInput, copied: transfers.Copied, watch: _Watch) -> None:
    elapsed = max(time.monotonic() - watch.began, 1e-6)
    retried = (
        f"{copied.retries} transient error{'s' * (copied.retries > 1)} retried" if copied.retries else ""
    )
    DataInput.objects.filter(id=data_input.id).update(
        stage_state="staged", bytes_done=copied.bytes, rate_bytes_s=copied.bytes / elapsed,
        stage_finished_at=timezone.now(), stage_detail=retried,
    )  # fmt: skip


def _fail(data_input: DataInput, message: str) -> None:
    DataInput.objects.filter(id=data_input.id).update(stage_state="failed", stage_detail=message[:500])
    raise StagingFailed(f"{data_input.name}: {message}")


# --------------------------------------------------------------------------- transfer slots


class NoRoom(transfers.TransferFailed):
    """The staging cache cannot take this fill without going past E31_STAGE_CACHE_BYTES."""


def _acquire_slot(data_input: DataInput, watch: _Watch, entry: DatasetCacheEntry | None = None) -> None:
    """A transfer slot, and room in the cache for ``entry``'s bytes: a fill with no room left ends the job's
    staging (NoRoom, a TransferFailed) once a sweep has removed what no live job pins. No slot: the input shows
    why it waits, and NoSlot gives the stager's thread back (``_fill`` lets go of ``entry`` as it passes)."""
    for swept in (False, True):
        try:
            if claim_slot(data_input_id=data_input.id, now=timezone.now(), entry=entry):
                return
            break
        except NoRoom:
            if swept:
                raise
            sweep_cache(now=timezone.now())  # unpinned entries make way: then look once more
    why = cache_fill.slot_refusal(
        timezone.now(), team_id=data_input.job.team_id, job_id=data_input.job_id, except_input=data_input.id
    )
    why = why or "waiting for a transfer slot"  # one freed as this looked: the next try takes it
    watch.update_row(stage_state="waiting", stage_detail=why, waiting_key=entry.key if entry else "")
    raise cache_fill.NoSlot(why)


def claim_slot(*, data_input_id: int, now: datetime, entry: DatasetCacheEntry | None = None) -> bool:
    """Marks the input staging only while a transfer slot is free to its team and the jobs that have waited longer
    leave one for it (``cache_fill.slot_refusal``: image pulls hold them too), and while the cache has room for
    ``entry``, the cache entry the input fills, if given (else NoRoom). The team's count is taken under the slot
    lock with the pool's, so two of its inputs cannot each take the team's last slot; the job leaves the line for a
    slot (``cache_fill.out_of_line``) in the same transaction.

    The room is checked under the slot lock in the same transaction as the slot is taken, so two fills
    cannot each count the room the other is about to take: what holds a slot has passed this check.

    No room ends the staging rather than waiting for room, as a job refused a slot does: what takes the room is inputs
    of jobs not yet released, which hold it until they have run (hours, not a copy's minutes). A stager
    waiting that long would hold one of the pool's few staging workers (E31_STAGE_CONCURRENCY + 1), so a
    team's jobs waiting for room would stall every other job's staging, cache hits included; and two jobs
    each holding some inputs staged and waiting for room for the rest would wait for each other for ever.
    The job ends staging_failed with how full the cache is, before it held any GPUs, and can be submitted
    again."""
    with transaction.atomic():
        cache_fill.lock_slots()
        job_id, team_id = DataInput.objects.values_list("job_id", "job__team_id").get(id=data_input_id)
        if not cache_fill.slot_free(now, team_id=team_id, job_id=job_id, except_input=data_input_id):
            return False
        if entry is not None:
            _check_room(entry, now)
            _check_team_share(entry, data_input_id, now)
        cache_fill.out_of_line(job_id)
        return bool(
            DataInput.objects.filter(id=data_input_id).update(
                stage_state="staging", bytes_done=0, rate_bytes_s=0, stage_started_at=now, stage_detail=""
            )
        )


def _check_room(entry: DatasetCacheEntry, now: datetime) -> None:
    """NoRoom unless ``entry`` fits beside what the cache holds (ready entries, datasets and images alike) and
    what is being copied into it now (fills holding a transfer slot, image pulls), all at their declared bytes.
    Fills still waiting for a slot do not count: each is checked as it takes one."""
    capacity = settings.E31_STAGE_CACHE_BYTES
    if entry.bytes > capacity:
        raise NoRoom(
            f"{entry.bytes:,} bytes is more than the pool's whole staging cache holds "
            f"({capacity:,} bytes, E31_STAGE_CACHE_BYTES)"
        )
    copying = cache_fill.copying_fills(now).exclude(id=entry.id)
    held = selectors.total_bytes(
        DatasetCacheEntry.objects.filter(state=READY),
        copying,
        ImageCacheEntry.objects.filter(state=ImageCacheEntry.READY),
        ImageCacheEntry.objects.filter(
            state=ImageCacheEntry.FILLING, updated_at__gte=cache_fill.stale_before(now)
        ),
    )
    if held + entry.bytes > capacity:
        # The team is not told what the pool holds: every team's inputs count in it (the operator's log is).
        log.warning(
            "staging cache full: %d of %d bytes held, an input of %d refused", held, capacity, entry.bytes
        )
        raise NoRoom(
            f"no room in the staging cache now for this input's {entry.bytes:,} bytes: its {capacity:,} bytes "
            "(E31_STAGE_CACHE_BYTES) are shared by the inputs of the pool's jobs not yet released and the copies "
            "in progress; submit the job again once some of them have finished"
        )


def _check_team_share(entry: DatasetCacheEntry, data_input_id: int, now: datetime) -> None:
    """NoRoom unless ``entry`` fits in its team's share of the cache (E31_STAGE_TEAM_SHARE) beside what the team
    holds (``image_staging.team_cache_bytes``). A copy counts at its declared size until it ends, so without a share
    one team's input as large as the cache, sent just above the speed floor, kept every other team's staging out
    for as long as the copy lasted."""
    team_id = DataInput.objects.values_list("job__team_id", flat=True).get(id=data_input_id)
    share = cache_fill.team_share_bytes()
    held = image_staging.team_cache_bytes(team_id, now, except_dataset=entry.id)
    if held + entry.bytes > share:
        raise NoRoom(
            f"no room in the team's share of the staging cache for this input's {entry.bytes:,} bytes: the team's "
            f"inputs being copied, staged for its live jobs, and its images hold {held:,} of its {share:,} bytes "
            f"(E31_STAGE_TEAM_SHARE of E31_STAGE_CACHE_BYTES); submit the job again once some of them have run"
        )


# --------------------------------------------------------------------------- eviction


def sweep_cache(*, now: datetime) -> int:
    """Drops finished jobs' data dirs, then evicts unpinned entries, datasets and images alike: past
    retention, then least recently used past capacity (entries being filled count at their declared bytes)."""
    _remove_finished_job_dirs()
    cache_fill.remove_orphan_parts(
        cache_dir(), DatasetCacheEntry, now=now, remove=lambda part: part.unlink(missing_ok=True)
    )
    image_staging.remove_orphan_parts(now)
    retention = timedelta(seconds=settings.E31_STAGE_RETENTION_S)
    evicted = sum(evict(entry) for entry in _evictable(now - retention))
    over = selectors.cache_bytes() - settings.E31_STAGE_CACHE_BYTES
    for entry in sorted(_evictable(None), key=lambda e: e[0]):
        if over <= 0:
            break
        if evict(entry):
            evicted, over = evicted + 1, over - entry[3]
    return evicted


def _evictable(used_before: datetime | None) -> list[tuple]:
    """(last used, kind, id, bytes) of every unpinned entry, those last used before ``used_before`` if given."""
    found = []
    for kind, entries in (("data", unpinned()), ("image", image_staging.unpinned())):
        if used_before is not None:
            entries = entries.filter(last_used_at__lt=used_before)
        found += [
            (used, kind, i, size) for i, used, size in entries.values_list("id", "last_used_at", "bytes")
        ]
    return found


def evict(entry: tuple) -> bool:
    _, kind, entry_id, _ = entry
    return image_staging.evict(entry_id) if kind == "image" else _evict(entry_id)


def unpinned():
    """Ready entries no live job (not yet released or ended) links to."""
    return DatasetCacheEntry.objects.filter(state=READY).exclude(inputs__job__state__in=ALIVE_STATES)


@transaction.atomic
def _evict(entry_id: int) -> bool:
    entry = (
        DatasetCacheEntry.objects.select_for_update(skip_locked=True).filter(id=entry_id, state=READY).first()
    )
    if entry is None or entry.inputs.filter(job__state__in=ALIVE_STATES).exists():
        return False  # pinned meanwhile, or another sweep has it
    # Unlinked while the row is locked: a new fill of the same key waits for this transaction.
    cache_path(entry.key).unlink(missing_ok=True)
    entry.delete()
    return True


def _remove_finished_job_dirs() -> None:
    root = settings.E31_STAGING_ROOT
    ids = [int(p.name) for p in root.iterdir() if p.name.isdigit()] if root.is_dir() else []
    alive = set(Job.objects.filter(id__in=ids, state__in=ALIVE_STATES).values_list("id", flat=True))
    for job_id in set(ids) - alive:
        remove_staged(job_id)
