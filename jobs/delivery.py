"""Output delivery after RELEASE, off the meter: sealed files to the declared destination, verified."""

import hashlib
import shutil
from datetime import datetime
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.db import transaction

from jobs import agent, declaration
from jobs.models import Allocation, Job


class DeliveryFailed(Exception):
    pass


def deliver_part(*, allocation_id: int, now: datetime) -> None:
    """Copies one part's outputs and checks each against the manifest; the last part marks the job delivered."""
    allocation = Allocation.objects.select_related("node", "job").get(id=allocation_id)
    job = allocation.job
    if job.delivered_at or job.delivery_state != "delivering":
        return
    try:
        destination = _destination(job.output_uri)
        _copy_verified(allocation, destination)
    except (DeliveryFailed, OSError) as exc:
        Job.objects.filter(id=job.id).update(delivery_state="failed", delivery_detail=str(exc)[:500])
        return
    with transaction.atomic():
        Allocation.objects.filter(id=allocation_id).update(delivered_at=now)
        if not Allocation.objects.filter(job=job, attempt=job.attempt, delivered_at__isnull=True).exists():
            Job.objects.filter(id=job.id).update(delivery_state="delivered", delivered_at=now)


def _destination(uri: str) -> Path:
    parts = urlsplit(uri)
    if parts.scheme != "file":
        raise DeliveryFailed(f"delivery to {parts.scheme}:// is not configured on this pool")
    real = declaration.resolve_under_roots(unquote(parts.path), settings.E31_OUTPUT_ROOTS)
    if real is None:
        raise DeliveryFailed("the destination is no longer under an allowed output root")
    return real


def _copy_verified(allocation: Allocation, destination: Path) -> None:
    source = agent.attempt_dirs(allocation).output
    prefix = f"rank{allocation.rank}/"
    multi = Allocation.objects.filter(job_id=allocation.job_id, attempt=allocation.attempt).count() > 1
    for entry in allocation.job.outputs:
        if multi and not entry["path"].startswith(prefix):
            continue
        rel = entry["path"].removeprefix(prefix) if multi else entry["path"]
        target = destination / entry["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / rel, target)
        if _sha256(target) != entry["sha256"]:
            raise DeliveryFailed(f"{entry['path']}: checksum differs at the destination")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
