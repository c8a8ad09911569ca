"""STAGE: copies a job's declared inputs to the pool's staging area before any GPU is held.

Runs off the meter. Each input is streamed through fsspec, its size held to the declaration
(a larger source is cut off and refused) and its sha256 checked when declared; progress is
written as it goes so the job page and the scheduler's ETA see it.
"""

import hashlib
import logging
import shutil
import time
from datetime import datetime, timedelta
from pathlib import Path

import fsspec
from django.conf import settings
from django.utils import timezone

from jobs import declaration, dispatch
from jobs.lifecycle import EndReason, State
from jobs.models import DataInput, Job
from jobs.services import transition

log = logging.getLogger(__name__)
CHUNK = 4 * 1024 * 1024
PROGRESS_EVERY_S = 0.5


class StagingFailed(Exception):
    pass


def stage_job(*, job_id: int, now: datetime) -> bool:
    """SUBMITTED -> STAGING -> QUEUED, or ENDED/staging_failed; False if another worker has it."""
    transition(job_id=job_id, source=State.SUBMITTED, target=State.STAGING, now=now, actor="stager",
               reason="staging inputs", worker_seen_at=now)  # fmt: skip
    if not _claim(job_id, now):
        return False
    try:
        for data_input in DataInput.objects.filter(job_id=job_id):
            _stage_input(data_input)
    except StagingFailed as exc:
        shutil.rmtree(job_dir(job_id), ignore_errors=True)
        transition(job_id=job_id, source=State.STAGING, target=State.ENDED, now=timezone.now(), actor="stager",
                   end_reason=EndReason.STAGING_FAILED, reason=str(exc)[:300], end_detail=str(exc)[:500])  # fmt: skip
        return True
    if transition(job_id=job_id, source=State.STAGING, target=State.QUEUED, now=timezone.now(), actor="stager",
                  reason="every input staged"):  # fmt: skip
        dispatch.request_scheduler_pass()
    return True


def _claim(job_id: int, now: datetime) -> bool:
    """One stager at a time: the one that just moved it, or a retry after the last went silent."""
    stale = now - timedelta(seconds=settings.E31_RECONCILE_AFTER_S)
    fresh = Job.objects.filter(id=job_id, state=State.STAGING, worker_seen_at=now).exists()
    return fresh or bool(
        Job.objects.filter(id=job_id, state=State.STAGING, worker_seen_at__lt=stale).update(
            worker_seen_at=now
        )
    )


def job_dir(job_id: int) -> Path:
    return settings.E31_STAGING_ROOT / str(job_id)


def _stage_input(data_input: DataInput) -> None:
    target = job_dir(data_input.job_id) / data_input.name
    target.parent.mkdir(parents=True, exist_ok=True)
    started = timezone.now()
    DataInput.objects.filter(id=data_input.id).update(
        stage_state="staging", bytes_done=0, stage_started_at=started, stage_detail=""
    )
    try:
        done, digest = _copy(data_input, target)
    except StagingFailed as exc:
        DataInput.objects.filter(id=data_input.id).update(stage_state="failed", stage_detail=str(exc)[:500])
        raise StagingFailed(f"{data_input.name}: {exc}") from exc
    if done != data_input.bytes:
        _fail(data_input, f"{done} bytes arrived, {data_input.bytes} were declared")
    if data_input.sha256 and digest != data_input.sha256:
        _fail(data_input, f"sha256 mismatch: got {digest[:12]}…, declared {data_input.sha256[:12]}…")
    elapsed = max((timezone.now() - started).total_seconds(), 1e-6)
    DataInput.objects.filter(id=data_input.id).update(
        stage_state="staged", bytes_done=done, rate_bytes_s=done / elapsed, stage_finished_at=timezone.now()
    )


def _fail(data_input: DataInput, message: str) -> None:
    DataInput.objects.filter(id=data_input.id).update(stage_state="failed", stage_detail=message[:500])
    raise StagingFailed(f"{data_input.name}: {message}")


def _copy(data_input: DataInput, target: Path) -> tuple[int, str]:
    source = _source_url(data_input.uri)
    digest = hashlib.sha256()
    done, began, last = 0, time.monotonic(), 0.0
    try:
        with fsspec.open(source, "rb") as src, target.open("wb") as dst:
            for chunk in iter(lambda: src.read(CHUNK), b""):
                done += len(chunk)
                if done > data_input.bytes:
                    raise StagingFailed(
                        f"the source is larger than the {data_input.bytes} bytes declared: cut off"
                    )
                dst.write(chunk)
                digest.update(chunk)
                if time.monotonic() - last >= PROGRESS_EVERY_S:
                    last = time.monotonic()
                    _progress(data_input, done, done / max(last - began, 1e-6))
    except (OSError, ValueError) as exc:
        raise StagingFailed(f"could not read {data_input.uri}: {exc}") from exc
    return done, digest.hexdigest()


def _source_url(uri: str) -> str:
    """A file:// source is re-checked at staging time: a symlink planted since submission cannot escape."""
    if not uri.startswith("file:"):
        return uri
    from urllib.parse import unquote, urlsplit

    real = declaration.resolve_under_roots(unquote(urlsplit(uri).path), settings.E31_DATA_ROOTS)
    if real is None:
        raise StagingFailed("the file is no longer under an allowed data root")
    return str(real)


def _progress(data_input: DataInput, done: int, rate: float) -> None:
    now = timezone.now()
    DataInput.objects.filter(id=data_input.id).update(bytes_done=done, rate_bytes_s=rate)
    Job.objects.filter(id=data_input.job_id).update(worker_seen_at=now)


def remove_staged(job_id: int) -> None:
    shutil.rmtree(job_dir(job_id), ignore_errors=True)
