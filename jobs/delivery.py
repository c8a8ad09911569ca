"""Output delivery after RELEASE, off the meter: sealed files to the declared destination, verified there.

Runs on the node that sealed them (its agent's queue), at most E31_DELIVERY_CONCURRENCY at once
per node. Each attempt delivers into a folder of its own, ``<destination>/<job id>-<attempt>/``, so a
delivery never replaces what another job, or another attempt of the same job, delivered. Each file is
written in a folder of the part's own beside the attempt's folder (``.<job id>-<attempt>.rank<n>.e31part/``),
hashed as it lands and renamed into place only when its sha256 matches the manifest (file://); on s3:// it is
read back and hashed. Transient errors are retried with backoff; progress (bytes and files done) is kept on an
OutputTransfer row whose lease lets a re-driven task take over from a silent one, never run beside a live one.
The part's whole log follows its files, beside the attempt's folder (``<job id>-<attempt>.log``).

A member may write in the team's output folder (a shared mount) and swap a folder for a link at any moment: every
name under the team's folder is reached from a folder held open, never through a link (jobs/beneath.py), and each
file is renamed between held folders, so what a check saw is what is written to.
"""

import contextlib
import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, F, Max, OuterRef, Q

from jobs import beneath, cache_fill, clock, declaration, dispatch, logs, sandbox, sharing, signals, transfers
from jobs.models import Allocation, Job, Node, OutputFile, OutputTransfer
from jobs.transfers import destinations, sources

WAITING, DELIVERING, DELIVERED, FAILED = (
    OutputTransfer.WAITING, OutputTransfer.DELIVERING, OutputTransfer.DELIVERED, OutputTransfer.FAILED,
)  # fmt: skip
SLOT_LOCK_BASE = 0x0E31_D000  # plus the node id: one advisory lock per node's delivery slots
WAIT_S = 0.5


class DeliveryFailed(Exception):
    pass


def deliver_part(*, allocation_id: int, now: datetime) -> None:
    """Copies one part's outputs and checks each against the manifest; the last part marks the job delivered."""
    allocation = Allocation.objects.select_related("node", "job", "job__team").get(id=allocation_id)
    job = allocation.job
    if job.delivered_at or job.delivery_state != "delivering":
        return
    if allocation.attempt != job.attempt:
        return  # an earlier attempt's files: only the current attempt's go to its folder, ``<job id>-<attempt>/``
    files = _part_files(allocation)
    transfer = _lease(allocation, files, now)
    if transfer is None:
        return  # delivered already, or a live task holds it
    watch = _Watch(transfer)
    try:
        _wait_for_slot(transfer, allocation.node_id, watch)
        _deliver(job.delivery_uri, job.team.slug, files, watch, rank=allocation.rank)
        _deliver_log(allocation, job)
    except transfers.TransferStopped:
        return  # a re-driven task took the lease over
    except (DeliveryFailed, transfers.TransferFailed, OSError) as exc:
        _failed(transfer, job, str(exc))
        return
    _delivered(transfer, allocation)


def _part_files(allocation: Allocation) -> list[tuple[dict, Path]]:
    """This part's manifest rows with their sealed files on this node."""
    source = sandbox.attempt_dirs(allocation).output
    prefix = f"rank{allocation.rank}/"
    multi = Allocation.objects.filter(job_id=allocation.job_id, attempt=allocation.attempt).count() > 1
    rows = OutputFile.objects.filter(job_id=allocation.job_id, attempt=allocation.attempt)
    if multi:
        rows = rows.filter(path__startswith=prefix)
    files = []
    for entry in rows.order_by("path").values("path", "bytes", "sha256").iterator(chunk_size=2000):
        files.append((entry, source / (entry["path"].removeprefix(prefix) if multi else entry["path"])))
    return files


def _lease(allocation: Allocation, files: list, now: datetime) -> OutputTransfer | None:
    """Takes the part's transfer row for this task: new, or left by a task silent past the reconcile delay."""
    transfer, _ = OutputTransfer.objects.get_or_create(
        allocation=allocation,
        defaults={"job_id": allocation.job_id, "updated_at": now, "files_total": len(files),
                  "bytes_total": sum(e["bytes"] for e, _ in files)},
    )  # fmt: skip
    token = uuid.uuid4().hex
    stale = now - timedelta(seconds=settings.E31_RECONCILE_AFTER_S)
    taken = OutputTransfer.objects.filter(
        Q(token="") | Q(updated_at__lt=stale), id=transfer.id, state__in=(WAITING, DELIVERING)
    ).update(token=token, updated_at=now, state=WAITING)
    if not taken:
        return None
    transfer.token = token
    return transfer


class _Watch:
    """Progress of the whole part; False (stop) once another task holds the lease."""

    def __init__(self, transfer: OutputTransfer) -> None:
        self.transfer = transfer
        self.base = 0  # bytes of the files already delivered
        self.began = self.last = time.monotonic()

    def due(self) -> bool:
        """True at most every PROGRESS_EVERY_S: time to write progress again."""
        if time.monotonic() - self.last < transfers.PROGRESS_EVERY_S:
            return False
        self.last = time.monotonic()
        return True

    def __call__(self, done: int) -> bool:
        total = self.base + done
        return self.beat(bytes_done=total, rate_bytes_s=total / max(time.monotonic() - self.began, 1e-6))

    def beat(self, **fields) -> bool:
        with cache_fill.progress_transaction():
            return bool(
                OutputTransfer.objects.filter(id=self.transfer.id, token=self.transfer.token).update(
                    updated_at=clock.now(), **fields
                )
            )


def _wait_for_slot(transfer: OutputTransfer, node_id: int, watch: _Watch) -> None:
    limit = settings.E31_DELIVERY_CONCURRENCY
    while not claim_slot(transfer=transfer, node_id=node_id, now=clock.now()):
        time.sleep(WAIT_S)
        if not watch.beat(detail=f"waiting for a delivery slot: {limit} at once per node"):
            raise transfers.TransferStopped()
    watch.began = time.monotonic()


def claim_slot(*, transfer: OutputTransfer, node_id: int, now: datetime) -> bool:
    """WAITING -> DELIVERING only while fewer than E31_DELIVERY_CONCURRENCY of the node's deliveries run."""
    stale = now - timedelta(seconds=settings.E31_RECONCILE_AFTER_S)
    with transaction.atomic():
        if connection.vendor == "postgresql":  # SQLite's single writer already serialises this
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SLOT_LOCK_BASE + node_id])
        running = OutputTransfer.objects.filter(
            state=DELIVERING, allocation__node_id=node_id, updated_at__gte=stale
        ).exclude(id=transfer.id)
        if running.count() >= settings.E31_DELIVERY_CONCURRENCY:
            return False
        return bool(
            OutputTransfer.objects.filter(id=transfer.id, token=transfer.token).update(
                state=DELIVERING, started_at=now, updated_at=now, detail=""
            )
        )


def _deliver(output_uri: str, team: str, files: list[tuple[dict, Path]], watch: _Watch, *, rank: int) -> None:
    """``output_uri`` is the attempt's own folder under the declared destination: nothing else is written
    (but for the part's own folder of files in transit, beside it)."""
    scheme = urlsplit(output_uri).scheme
    if scheme not in ("file", "s3"):
        raise DeliveryFailed(f"delivery to {scheme}:// is not configured on this pool")
    if scheme == "s3":
        _s3_url(output_uri, team)  # before any copy
        for count, (entry, source) in enumerate(files, start=1):
            _deliver_s3(source, _s3_url(output_uri, team, key=entry["path"]), entry, watch)
            _note_delivered(watch, entry, count, len(files))
        return
    with _file_destination(output_uri, team) as (beside, name):
        with (
            beneath.closing(beneath.open_dir(beside, [name], create=True)) as root,
            _part_folder(beside, name, rank) as parts,
        ):
            for count, (entry, source) in enumerate(files, start=1):
                _deliver_file(source, (root, entry["path"]), (parts, str(count)), entry, watch)
                _note_delivered(watch, entry, count, len(files))


def _note_delivered(watch: _Watch, entry: dict, count: int, total: int) -> None:
    watch.base += entry["bytes"]
    if count == total or watch.due():  # thousands of small files: a progress write per half second
        watch.beat(files_done=count, bytes_done=watch.base)


@contextlib.contextmanager
def _part_folder(beside: int, root: str, rank: int) -> Iterator[int]:
    """Where the part's files are written before each is renamed into place: beside the attempt's folder, not
    in it, so no temporary name is, or replaces, one of the job's own files. Held open while the part is
    delivered (renamed away and a link put in its place, it is still the folder written to). Removed once the
    part is through, unless a re-driven task took the part over (it writes there now)."""
    name = f".{root}.rank{rank}.e31part"
    fd = _open_part_folder(beside, name)
    keep = False
    try:
        yield fd
    except transfers.TransferStopped:
        keep = True
        raise
    finally:
        if not keep:
            _remove_part_folder(beside, name, fd)
        os.close(fd)


def _remove_part_folder(beside: int, name: str, fd: int) -> None:
    """Emptied through the held folder, then removed by name: rmdir never follows a link, and nothing here opens
    whatever may stand under that name now (a FIFO would hold the task, and its node's delivery slot)."""
    with contextlib.suppress(OSError):
        for entry in os.listdir(fd):
            with contextlib.suppress(OSError):
                os.unlink(entry, dir_fd=fd)
        os.rmdir(name, dir_fd=beside)


def _open_part_folder(beside: int, name: str) -> int:
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=beside)
    try:
        return beneath.open_dir(beside, [name])
    except beneath.NotBeneath:
        os.unlink(name, dir_fd=beside)  # a link planted under this name is removed, never followed
        os.mkdir(name, 0o700, dir_fd=beside)
        return beneath.open_dir(beside, [name])


def log_uri(job: Job, rank: int, ranks: int) -> str:
    """Beside the attempt's folder, not in it: no name the job's own outputs use can be overwritten."""
    part = f".rank{rank}" if ranks > 1 else ""
    return f"{job.delivery_uri.rstrip('/')}{part}.log"


def _deliver_log(allocation: Allocation, job: Job) -> None:
    """The part's whole log as the database holds it (up to E31_LOG_CAP_BYTES), written beside its outputs."""
    ranks = Allocation.objects.filter(job_id=job.id, attempt=allocation.attempt).count()
    uri = log_uri(job, allocation.rank, ranks)
    chunks = logs.log_bytes(job, attempt=allocation.attempt, rank=allocation.rank)
    if urlsplit(uri).scheme == "s3":
        with sources.filesystem_for(uri).open(_s3_url(uri, job.team.slug), "wb") as dst:
            for chunk in chunks:
                dst.write(chunk)
        return
    # Beside the attempt's folder, in the folder that holds it, held open from the team's prefix down.
    with _file_destination(job.delivery_uri, job.team.slug) as (beside, _):
        target = uri.rsplit("/", 1)[-1]
        part = f".{target}.e31part"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part, dir_fd=beside)  # a link planted under this name is removed, never followed
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(part, flags, 0o644, dir_fd=beside), "wb") as dst:
            for chunk in chunks:
                dst.write(chunk)
        os.replace(part, target, src_dir_fd=beside, dst_dir_fd=beside)


@contextlib.contextmanager
def _file_destination(uri: str, team: str) -> Iterator[tuple[int, str]]:
    """The folder that holds the attempt's folder, made under the team's prefix of an output root and held open,
    with the attempt folder's name in it: everything delivered is reached from there."""
    if declaration.file_uri_suffix_problem(
        uri
    ):  # refused at intake; a job stored before would share one folder
        raise DeliveryFailed('a file destination is a path alone, with no "?" or "#"')
    prefixes = declaration.team_prefixes(settings.E31_OUTPUT_ROOTS, team)
    folder = declaration.resolve_under_roots(unquote(urlsplit(uri).path), prefixes)
    if folder is None or folder in prefixes:
        raise DeliveryFailed("the destination is not under the team's folder of an output root")
    try:
        # Resolved by name just now: made and opened again from the prefix, a link put on the way since refused.
        beside = beneath.open_under(folder.parent, prefixes, create=True)
    except beneath.NotBeneath as exc:
        raise DeliveryFailed("the destination's folder leads outside the team's folder") from exc
    with beneath.closing(beside):
        yield beside, folder.name


def _s3_url(uri: str, team: str, *, key: str | None = None) -> str:
    """``uri`` (the attempt's folder, or its log beside it), or the object ``key`` in that folder, checked
    against the team's prefixes of the S3 roots configured now; a refusal fails the delivery."""
    prefixes = sharing.s3_prefixes(team)
    try:
        if key is None:
            return declaration.check_s3_under(uri, prefixes)
        return declaration.s3_object(uri, key, prefixes)
    except declaration.OutsideTeamPrefix as exc:
        raise DeliveryFailed(str(exc)) from exc


@contextlib.contextmanager
def _safe_target(root: int, rel: str) -> Iterator[tuple[int, str]]:
    """The file's folder under the attempt's (``root``), made and held open, and its name there: a link planted on
    the way, or swapped in at any time before, fails the delivery rather than lead it elsewhere."""
    try:
        *folders, name = beneath.names(rel)
        folder = beneath.open_dir(root, folders, create=True)
    except beneath.NotBeneath as exc:
        raise DeliveryFailed(f"{rel}: its folder at the destination leads outside it") from exc
    with beneath.closing(folder):
        yield folder, name


def _deliver_file(
    source: Path, target: tuple[int, str], part: tuple[int, str], entry: dict, watch: _Watch
) -> None:
    """Lands the file in the part's folder, hashed as it is written, and renames it in only when it matches.
    ``target`` is the attempt's folder held open and the file's path in it; ``part``, the part's folder and the
    file's name there."""
    root, rel = target
    parts, name = part
    with _safe_target(root, rel):
        pass  # its folders made, and checked, before a copy that may take hours
    for attempt in range(settings.E31_TRANSFER_RETRIES + 1):
        local = sources.LocalSource(source)
        try:
            copied = destinations.copy(
                local, beneath.path_in(parts, name), limit=entry["bytes"], want_sha256=True, progress=watch,
                retries=settings.E31_TRANSFER_RETRIES, backoff_s=settings.E31_TRANSFER_BACKOFF_S,
            )  # fmt: skip
        finally:
            local.close()
        if copied.bytes == entry["bytes"] and copied.sha256 == entry["sha256"]:
            # Walked again now, not as it was before the copy: a link swapped in meanwhile fails the delivery.
            with _safe_target(root, rel) as (folder, final):
                os.replace(name, final, src_dir_fd=parts, dst_dir_fd=folder)
            return
        _note_retry(watch, attempt, f"{entry['path']}: the copy's checksum differs from the manifest")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=parts)
    raise DeliveryFailed(f"{entry['path']}: checksum differs at the destination")


def _deliver_s3(source: Path, url: str, entry: dict, watch: _Watch) -> None:
    """Uploads through fsspec (s3fs), then reads the object back: its sha256 must match the manifest."""
    fs = sources.filesystem_for(url)
    for attempt in range(settings.E31_TRANSFER_RETRIES + 1):
        try:
            _upload(fs, source, url, watch)
            if _remote_sha256(fs, url) == entry["sha256"]:
                return
            problem = f"{entry['path']}: the object's checksum differs from the manifest"
        except (OSError, transfers.Transient) as exc:
            problem = f"{entry['path']}: {exc}"
        _note_retry(watch, attempt, problem)
    raise DeliveryFailed(problem)


def _upload(fs, source: Path, url: str, watch: _Watch) -> None:
    done, last = 0, time.monotonic()
    with source.open("rb") as src, fs.open(url, "wb") as dst:
        while block := src.read(transfers.CHUNK):
            dst.write(block)
            done += len(block)
            if time.monotonic() - last >= transfers.PROGRESS_EVERY_S:
                last = time.monotonic()
                transfers.report(watch, done)


def _remote_sha256(fs, url: str) -> str:
    digest = hashlib.sha256()
    with fs.open(url, "rb", block_size=transfers.CHUNK) as handle:
        while block := handle.read(transfers.CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _note_retry(watch: _Watch, attempt: int, problem: str) -> None:
    if attempt < settings.E31_TRANSFER_RETRIES:
        watch.beat(detail=f"retrying: {problem}"[:500], retries=attempt + 1)
        time.sleep(min(transfers.MAX_BACKOFF_S, settings.E31_TRANSFER_BACKOFF_S * 2**attempt))


@transaction.atomic
def _failed(transfer: OutputTransfer, job: Job, message: str) -> None:
    """Fails the part and its job's delivery, but only while this task still holds the part's lease."""
    was = Job.objects.select_for_update().values_list("delivery_state", flat=True).get(id=job.id)
    now = clock.now()
    if not _finish(transfer, now, state=FAILED, detail=message[:500]):
        return  # a re-driven task took the lease over: the part, and the job, are its to finish
    Job.objects.filter(id=job.id).update(delivery_state="failed", delivery_detail=message[:500])
    if was != "failed":  # told once, whichever of its parts failed first
        _tell_outputs_lost(job.id, message, now=now)
    dispatch.request_scheduler_pass()  # the jobs that waited for these outputs end now, unmetered


def _tell_outputs_lost(job_id: int, message: str, *, now: datetime) -> None:
    """The team hears of it as of a failure (e-mail, webhooks): its outputs are gone, whatever its end (after a
    success, its results)."""
    attempt = Job.objects.filter(id=job_id).values_list("attempt", flat=True).get()
    signals.job_event.send(
        sender=Job, job_id=job_id, event="output_failed", attempt=attempt, now=now, detail=message[:300]
    )


@transaction.atomic
def _delivered(transfer: OutputTransfer, allocation: Allocation) -> None:
    """Marks the part delivered (and the job, once it was the last), only while this task holds the lease."""
    # The job's row first: parts finishing at once then take turns, and the last one sees every other delivered
    # (each would otherwise look before the other committed, and neither would mark the job delivered).
    Job.objects.select_for_update().only("id").get(id=allocation.job_id)
    now = clock.now()
    done = {"bytes_done": transfer.bytes_total, "files_done": transfer.files_total}
    if not _finish(transfer, now, state=DELIVERED, detail="", **done):
        return  # a re-driven task took the lease over
    Allocation.objects.filter(id=allocation.id).update(delivered_at=now)
    job = allocation.job
    if not Allocation.objects.filter(job=job, attempt=job.attempt, delivered_at__isnull=True).exists():
        Job.objects.filter(id=job.id).update(delivery_state="delivered", delivered_at=now)
        dispatch.request_scheduler_pass()  # the jobs that waited for these outputs stage now


def _finish(transfer: OutputTransfer, now: datetime, **fields) -> bool:
    """Ends the part's transfer; False when this task's lease is gone (taken over, or the part already ended)."""
    return bool(
        OutputTransfer.objects.filter(
            id=transfer.id, token=transfer.token, state__in=(WAITING, DELIVERING)
        ).update(finished_at=now, updated_at=now, **fields)
    )


def fail_stranded(*, now: datetime) -> list[int]:
    """Jobs still delivering a part whose node has been down for E31_DELIVERY_NODE_GRACE_S: the part's files
    are on that node's disk, so its delivery fails, and says why, rather than keep the job (and every job that
    runs after it) waiting for a node that is not coming back."""
    gone_before = now - timedelta(seconds=settings.E31_DELIVERY_NODE_GRACE_S)
    stranded = Allocation.objects.filter(
        job__delivery_state="delivering", attempt=F("job__attempt"), delivered_at__isnull=True,
        node__state=Node.NodeState.DOWN, node__state_changed_at__lt=gone_before,
    ).values_list("job_id", "node__name", "node__state_changed_at")  # fmt: skip
    failed = []
    for job_id, node, down_since in stranded[:200]:
        message = (
            f"not delivered: node {node}, which holds this attempt's outputs, has been down since "
            f"{down_since:%Y-%m-%d %H:%M} UTC"
        )
        with transaction.atomic():
            if Job.objects.filter(id=job_id, delivery_state="delivering").update(
                delivery_state="failed", delivery_detail=message
            ):
                OutputTransfer.objects.filter(job_id=job_id, state__in=(WAITING, DELIVERING)).update(
                    state=FAILED, detail=message, finished_at=now, updated_at=now
                )
                _tell_outputs_lost(job_id, message, now=now)
                failed.append(job_id)
    return failed


def finish_delivered_jobs() -> list[int]:
    """Jobs still "delivering" although every part of their attempt is delivered, marked delivered (at their last
    part's time): parts that once finished at the same instant could each miss the other's record."""
    parts = Allocation.objects.filter(job=OuterRef("pk"), attempt=OuterRef("attempt"))
    stuck = Job.objects.filter(delivery_state="delivering", delivered_at__isnull=True).filter(
        Exists(parts), ~Exists(parts.filter(delivered_at__isnull=True))
    )
    finished = []
    for job_id, attempt in stuck.values_list("id", "attempt")[:200]:
        last = Allocation.objects.filter(job_id=job_id, attempt=attempt).aggregate(at=Max("delivered_at"))[
            "at"
        ]
        if Job.objects.filter(id=job_id, delivery_state="delivering").update(
            delivery_state="delivered", delivered_at=last
        ):
            finished.append(job_id)
    return finished
