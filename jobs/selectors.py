"""Reads shared by pages and the API: transfers in flight and their progress, the staging cache,
the queue's size classes, the datasets the scheduler plans with. Nothing here writes.
"""

from django.conf import settings
from django.db.models import QuerySet, Sum

from jobs.lifecycle import ALIVE, State
from jobs.models import DataInput, DatasetCacheEntry, Job, OutputTransfer

ALIVE_STATES = [s.value for s in ALIVE]
# The queue's size classes by GPU count; the members' queue and the operators' queue filter alike.
SIZE_CLASSES = {"1": (1, 1), "2-4": (2, 4), "5-8": (5, 8), ">8": (9, 10**6)}


def of_size(jobs: QuerySet, size: str) -> QuerySet:
    """The jobs whose GPU count falls in the size class; an unknown class filters nothing."""
    if size not in SIZE_CLASSES:
        return jobs
    low, high = SIZE_CLASSES[size]
    return jobs.filter(gpus__gte=low, gpus__lte=high)


# --------------------------------------------------------------------------- transfers


def eta_s(item: DataInput | OutputTransfer) -> float | None:
    """Seconds left for an input being staged or outputs being delivered, from the rate so far."""
    total = getattr(item, "bytes_total", None) or getattr(item, "bytes", 0)
    if getattr(item, "stage_state", "staging") != "staging" or not item.rate_bytes_s:
        return None
    return max(0.0, (total - item.bytes_done) / item.rate_bytes_s)


def current_deliveries(job: Job) -> list[OutputTransfer]:
    """The current attempt's delivery rows (one per node part), oldest part first."""
    return list(job.output_transfers.filter(allocation__attempt=job.attempt))


def staging_in_flight() -> QuerySet:
    """Every input of a staging job that is being copied or waiting for a slot or a shared fill."""
    return (
        DataInput.objects.filter(job__state=State.STAGING, stage_state__in=("staging", "waiting"))
        .select_related("job", "job__team")
        .order_by("job_id", "position")
    )


def deliveries_in_flight() -> QuerySet:
    """Deliveries waiting for a slot or copying now, for the operators' transfers page."""
    return (
        OutputTransfer.objects.filter(state__in=(OutputTransfer.WAITING, OutputTransfer.DELIVERING))
        .select_related("job", "job__team", "allocation__node")
        .order_by("updated_at")
    )


# --------------------------------------------------------------------------- the staging cache


def cache_bytes() -> int:
    return DatasetCacheEntry.objects.aggregate(total=Sum("bytes"))["total"] or 0


def cache_summary() -> dict:
    """The configured policy and what the cache holds now, for the transfers and job pages."""
    pinned_ids = DatasetCacheEntry.objects.filter(inputs__job__state__in=ALIVE_STATES).values("id")
    pinned = DatasetCacheEntry.objects.filter(id__in=pinned_ids).aggregate(n=Sum("bytes"))["n"] or 0
    return {
        "capacity_bytes": settings.E31_STAGE_CACHE_BYTES,
        "retention_s": settings.E31_STAGE_RETENTION_S,
        "used_bytes": cache_bytes(),
        "pinned_bytes": pinned,
        "entries": DatasetCacheEntry.objects.filter(state=DatasetCacheEntry.READY).count(),
        "concurrency": settings.E31_STAGE_CONCURRENCY,
    }


def job_datasets(job_ids: list[int]) -> dict[int, frozenset[str]]:
    """Cache keys of each job's staged datasets (the scheduler's ``PendingJob.datasets``)."""
    keys: dict[int, set[str]] = {}
    rows = DatasetCacheEntry.objects.filter(state=DatasetCacheEntry.READY, inputs__job_id__in=job_ids)
    for job_id, key in rows.values_list("inputs__job_id", "key"):
        keys.setdefault(job_id, set()).add(key)
    return {job_id: frozenset(k) for job_id, k in keys.items()}
