"""Job logs in the database: the agent appends what the job writes; pages, the API and the CLI read it.

Offsets are bytes of the part's log (attempt, rank). Reads hand back text that ends on a whole UTF-8
character, so a follower that resumes at ``next_offset`` never sees a character cut in two.

Logs are kept E31_LOG_KEEP_DAYS after their job ends, then removed (``prune_logs``): the job keeps its
events and ledger rows, and ``removed_note`` is what every reader shows in the log's place.
"""

import codecs
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, QuerySet, Sum
from django.db.models.functions import Greatest, Length
from django.utils import timezone

from jobs.lifecycle import TERMINAL
from jobs.models import Allocation, Job, LogChunk, OutputFile, TeamLogBytes

CHUNK_BYTES = 256 * 1024
READ_BYTES = 1024 * 1024


def append_log(*, job_id: int, attempt: int, rank: int, offset: int, data: bytes) -> None:
    """Stores ``data`` at ``offset``; a piece sent twice (a retry after a lost reply) is stored once.

    A resend may carry more than the send whose reply was lost: only its bytes past the end already
    stored are new, so the log keeps every byte once and no chunk hides behind a shorter one. What the
    team's log budget has no room for is not stored: the part's log keeps what fitted and ends with a
    note saying why (``budget_note``), and nothing is stored past the note, so its offsets stay the log's own.
    """
    team_id, removed = Job.objects.values_list("team_id", "log_removed_at").get(id=job_id)
    part = Allocation.objects.filter(job_id=job_id, attempt=attempt, rank=rank)
    if removed is not None or part.filter(log_cut_at__isnull=False).exists():
        return  # retention removed the log (and gave its bytes back), or the budget ended it
    with transaction.atomic():
        stored_end = _stored_end(job_id, attempt, rank)
        if stored_end > offset:
            data, offset = data[stored_end - offset :], max(offset, stored_end)
        if not data:
            return
        # Stored first, then counted with one conditional UPDATE: the team's row is locked from that UPDATE to
        # the commit only, so the team's parts store their pieces side by side and never pass the budget together.
        undo = transaction.savepoint()
        _store(job_id, attempt, rank, offset, data)
        if _count(team_id, len(data), within=settings.E31_TEAM_LOG_BYTES):
            return
        transaction.savepoint_rollback(undo)
        if _cut(team_id, (job_id, attempt, rank), offset, data):
            part.update(log_cut_at=timezone.now())  # after its chunks: the job's row before its allocation's


def _count(team_id: int, size: int, *, within: int) -> bool:
    counted = TeamLogBytes.objects.filter(team_id=team_id, bytes__lte=within - size)
    return bool(counted.update(bytes=F("bytes") + size))


def _cut(team_id: int, part: tuple[int, int, int], offset: int, data: bytes) -> bool:
    """The piece past the budget (or the team's first): what room is left, and the note where nothing more fits,
    stored and counted under the team's row lock. True when the note ended the part's log."""
    held = TeamLogBytes.objects.select_for_update().filter(team_id=team_id).first()
    if held is None:  # the team's first log: made once, whichever part gets here first
        TeamLogBytes.objects.bulk_create([TeamLogBytes(team_id=team_id)], ignore_conflicts=True)
        held = TeamLogBytes.objects.select_for_update().get(team_id=team_id)
    kept = data[: max(0, settings.E31_TEAM_LOG_BYTES - held.bytes)]
    ended = len(kept) < len(data)
    if ended:
        kept += budget_note()
    _store(*part, offset, kept)
    TeamLogBytes.objects.filter(team_id=team_id).update(bytes=F("bytes") + len(kept))
    return ended


def budget_note() -> bytes:
    """Where the team's log budget cut a part's log; it counts against the budget, once a part."""
    return (
        f"\n[log cut: the team's logs held by the console reached {settings.E31_TEAM_LOG_BYTES:,} bytes "
        f"(E31_TEAM_LOG_BYTES); further output discarded. Each log is removed {_days(settings.E31_LOG_KEEP_DAYS)} "
        "after its job ends, which makes room again.]\n"
    ).encode()


def _store(job_id: int, attempt: int, rank: int, offset: int, data: bytes) -> None:
    LogChunk.objects.bulk_create(
        (
            LogChunk(
                job_id=job_id, attempt=attempt, rank=rank, offset=offset + i, data=data[i : i + CHUNK_BYTES]
            )
            for i in range(0, len(data), CHUNK_BYTES)
        ),
        ignore_conflicts=True,
    )


def _stored_end(job_id: int, attempt: int, rank: int) -> int:
    last = (
        LogChunk.objects.filter(job_id=job_id, attempt=attempt, rank=rank)
        .annotate(size=Length("data"))
        .order_by("-offset")
        .values_list("offset", "size")
        .first()
    )
    return last[0] + last[1] if last else 0


@dataclass(frozen=True)
class LogSlice:
    attempt: int
    rank: int
    ranks: int
    latest_attempt: int
    offset: int
    next_offset: int
    text: str
    complete: bool  # nothing more will ever be appended at or after next_offset
    removed: str = ""  # set when retention removed the log: the sentence shown in its place


class NoSuchLog(LookupError):
    """The job never had this attempt, or the attempt no such part (the message says what exists)."""


def read_log(job: Job, *, attempt: int, rank: int, offset: int) -> LogSlice:
    """Up to a megabyte of a part's log from ``offset``; ``attempt`` 0 means the latest."""
    attempt = attempt or job.attempt
    parts = check_exists(job, attempt=attempt, rank=rank)
    if job.log_removed_at is not None:
        return LogSlice(
            attempt=attempt, rank=rank, ranks=max(parts, 1), latest_attempt=job.attempt, offset=offset,
            next_offset=offset, text="", complete=True, removed=removed_note(job),
        )  # fmt: skip
    data = _bytes_from(job.id, attempt, rank, offset)
    # A read that filled READ_BYTES may have stopped short of the stored end; only a shorter one reached it.
    at_end = _part_finished(job, attempt, rank) and len(data) < READ_BYTES
    text, used = _whole_characters(data, final=at_end)
    return LogSlice(
        attempt=attempt, rank=rank, ranks=max(parts, 1), latest_attempt=job.attempt, offset=offset,
        next_offset=offset + used, text=text, complete=at_end,
    )  # fmt: skip


def removed_note(job: Job) -> str:
    """The sentence a page, the API and the CLI show for a log retention removed; "" while it is kept, and for a
    job that never ran (it had no log to lose; the pruner marks it all the same, so its index forgets it)."""
    if job.log_removed_at is None or job.attempt == 0:
        return ""
    days = (job.log_removed_at - job.state_changed_at).days
    return (
        f"The log was removed on {job.log_removed_at:%Y-%m-%d}, {_days(days)} after the job ended: "
        f"the console keeps job logs {_days(settings.E31_LOG_KEEP_DAYS)}."
    )


def _days(n: int) -> str:
    return f"{n} day" if n == 1 else f"{n} days"


def check_exists(job: Job, *, attempt: int, rank: int) -> int:
    """NoSuchLog for an attempt or a rank ``job`` never had (``attempt`` 0: the latest); else how many parts the
    attempt has. A log that never was would read as empty and complete (and a follower of a running job's would
    wait for ever). Ranks are known once the attempt has its nodes: before (queued), any may be followed."""
    attempt = attempt or job.attempt
    parts = Allocation.objects.filter(job_id=job.id, attempt=attempt).count()
    if attempt > job.attempt:
        raise NoSuchLog(f"no attempt {attempt}: job {job.id} has had {job.attempt}")
    if parts and rank >= parts:
        ranks = "rank 0 only" if parts == 1 else f"ranks 0 to {parts - 1}"
        raise NoSuchLog(
            f"attempt {attempt} of job {job.id} ran on {parts} node{'' if parts == 1 else 's'}: {ranks}"
        )
    return parts


def log_bytes(job: Job, *, attempt: int, rank: int):
    """The whole of a part's log, chunk by chunk, for a download."""
    chunks = LogChunk.objects.filter(job=job, attempt=attempt or job.attempt, rank=rank).order_by("offset")
    for chunk in chunks.values_list("data", flat=True).iterator(chunk_size=16):
        yield bytes(chunk)


def _bytes_from(job_id: int, attempt: int, rank: int, offset: int) -> bytes:
    chunks = LogChunk.objects.filter(
        job_id=job_id,
        attempt=attempt,
        rank=rank,
        offset__gt=offset - CHUNK_BYTES,
        offset__lt=offset + READ_BYTES,
    ).order_by("offset")
    data = bytearray()
    for start, piece in chunks.values_list("offset", "data"):
        data += bytes(piece)[max(0, offset - start) :] if start < offset else bytes(piece)
    return bytes(data[:READ_BYTES])


def _part_finished(job: Job, attempt: int, rank: int) -> bool:
    """True once the part's process has exited and the agent shipped its last bytes (or never will: its log was cut)."""
    if job.state in TERMINAL or attempt < job.attempt:
        return True
    ended = Q(finished_at__isnull=False) | Q(released_at__isnull=False) | Q(log_cut_at__isnull=False)
    return Allocation.objects.filter(ended, job_id=job.id, attempt=attempt, rank=rank).exists()


def _whole_characters(data: bytes, *, final: bool) -> tuple[str, int]:
    """Decodes ``data``, holding back a UTF-8 character cut at the end unless nothing more will come."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text = decoder.decode(data, final=final)
    held_back = len(decoder.getstate()[0])
    return text, len(data) - held_back


# Followers that may wait at once in one web process; the rest are told to come back, so long-polls
# never take every thread and pages stay as fast while many terminals follow logs.
_WAITERS = threading.BoundedSemaphore(settings.E31_LOG_WAITERS_PER_PROCESS)
POLL_S = 0.5
BUSY_RETRY_S = 2.0


def follow_log(job: Job, *, attempt: int, rank: int, offset: int, wait_s: float) -> tuple[LogSlice, float]:
    """read_log, waiting up to ``wait_s`` for new bytes; (slice, seconds the caller should wait before asking again)."""
    piece = read_log(job, attempt=attempt, rank=rank, offset=offset)
    if piece.text or piece.complete or wait_s <= 0:
        return piece, 0.0
    if not _WAITERS.acquire(blocking=False):
        return piece, BUSY_RETRY_S
    try:
        deadline = time.monotonic() + wait_s
        while not (piece.text or piece.complete) and time.monotonic() < deadline:
            time.sleep(POLL_S)
            job.refresh_from_db(fields=["state", "attempt"])
            piece = read_log(job, attempt=piece.attempt if attempt else 0, rank=rank, offset=offset)
    finally:
        _WAITERS.release()
    return piece, 0.0


# Jobs per transaction: each may hold E31_LOG_CAP_BYTES per part and attempt, so a batch stays a short delete.
PRUNE_JOBS = 100
# Rows of their lists of output files per transaction: a job holds up to E31_MAX_OUTPUT_FILES per attempt, and a
# preemption spends no attempt, so a batch's rows have no bound of their own.
PRUNE_FILES = 50_000


def prune_logs(*, now: datetime, keep_days: int, batch: int = PRUNE_JOBS) -> int:
    """Removes the logs of jobs that ended more than ``keep_days`` before ``now`` (how many jobs), and with them
    the lists of their output files (every attempt's; the files stay where they were delivered, and the job's
    summary of them stays). A job whose outputs are still being delivered keeps both: delivery copies the log
    beside the outputs and checks them against the list."""
    cutoff, pruned = now - timedelta(days=keep_days), 0
    while ids := _next_due(cutoff, batch):
        # The lists first, the mark after: a pruner stopped between leaves the jobs due, never rows behind.
        _remove_lists_of_files(ids)
        removed = _prune_batch(ids=ids, cutoff=cutoff, now=now)
        if not removed:  # each of them taken by a concurrent pruner meanwhile: it goes on from there
            break
        pruned += removed
    return pruned


def _due(cutoff: datetime) -> QuerySet[Job]:
    due = Job.objects.filter(state__in=TERMINAL, state_changed_at__lt=cutoff, log_removed_at__isnull=True)
    return due.exclude(delivery_state="delivering").order_by("state_changed_at", "id")


def _next_due(cutoff: datetime, batch: int) -> list[int]:
    """Due jobs no other pruner holds now (it prunes those), so that each pruner goes on past the other's batch."""
    with transaction.atomic():
        return list(
            _due(cutoff).select_for_update(skip_locked=True, no_key=True).values_list("id", flat=True)[:batch]
        )


def _remove_lists_of_files(job_ids: list[int]) -> None:
    """Every attempt's list of output files of these jobs, PRUNE_FILES rows a transaction."""
    while True:
        chunk = OutputFile.objects.filter(job_id__in=job_ids).order_by().values("id")[:PRUNE_FILES]
        removed, _ = OutputFile.objects.filter(id__in=chunk).delete()
        if removed < PRUNE_FILES:
            return


@transaction.atomic
def _prune_batch(*, ids: list[int], cutoff: datetime, now: datetime) -> int:
    # Locked (and skipped by a concurrent pruner): each log is removed, and its job marked, once. NO KEY: a row
    # naming the job (a re-run, a webhook delivery) may still be inserted while the batch's logs are deleted.
    locked = _due(cutoff).filter(id__in=ids).select_for_update(skip_locked=True, no_key=True)
    ids = list(locked.values_list("id", flat=True))
    if not ids:
        return 0
    OutputFile.objects.filter(job_id__in=ids).delete()  # what a pruner stopped meanwhile left: mostly nothing
    chunks = LogChunk.objects.filter(job_id__in=ids)
    by_team = chunks.values_list("job__team_id").annotate(size=Sum(Length("data"))).order_by("job__team_id")
    for team_id, size in by_team:  # in the teams' order, so two pruners never wait on each other's rows
        # Never below nothing: bytes the count never saw (written by an older agent while it was deployed, or
        # removed by hand) must not stop retention, for this team or any other in the batch.
        TeamLogBytes.objects.filter(team_id=team_id).update(bytes=Greatest(F("bytes") - size, 0))
    chunks.delete()
    # The page's tail is part of the log; the job row itself (a record) stays.
    return Job.objects.filter(id__in=ids, log_removed_at__isnull=True).update(log_removed_at=now, log_tail="")
