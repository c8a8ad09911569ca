"""What the GPUs did: each GPU's latest reading (the pool page) and per-minute summaries of allocated GPUs.

Written by the node agents' samplers. Metrics, not the meter: a lost minute leaves a gap in a chart,
never in the ledger, so a summary already stored (an agent retrying after a database error) is kept.
Minutes older than E31_GPU_MINUTES_KEEP_DAYS are folded into their allocation's ``GpuUseSummary``
and deleted, so the table stays the size of its window while every job keeps its GPU use.
"""

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Count, F, Max, Sum

from jobs.models import Allocation, GpuMinute, GpuUseSummary, NodeGpu

READING_FIELDS = ("utilisation", "memory_used_bytes", "power_w", "temperature_c", "sampled_at")
MINUTE_FIELDS = ("gpu_index", "minute", "samples", "utilisation_avg", "utilisation_max", "memory_used_max_bytes",
                 "power_avg_w", "temperature_max_c")  # fmt: skip


def record_gpu_readings(*, node_name: str, readings: Sequence[Mapping], now: datetime) -> int:
    """Each sampled GPU's latest utilisation, memory used, power and temperature; one UPDATE for all."""
    by_index = {int(r["index"]): r for r in readings}
    rows = list(NodeGpu.objects.filter(node__name=node_name, index__in=list(by_index)))
    for row in rows:
        reading = by_index[row.index]
        row.utilisation, row.memory_used_bytes = reading["utilisation"], reading["memory_used_bytes"]
        row.power_w, row.temperature_c, row.sampled_at = reading["power_w"], reading["temperature_c"], now
    return NodeGpu.objects.bulk_update(rows, READING_FIELDS) if rows else 0


def record_gpu_minutes(*, node_name: str, minutes: Sequence[Mapping]) -> int:
    """Stores the agent's minute summaries of allocations on its own node (how many were); others are ignored."""
    ids = {int(m["allocation_id"]) for m in minutes}
    own = set(Allocation.objects.filter(id__in=ids, node__name=node_name).values_list("id", flat=True))
    rows = [
        GpuMinute(allocation_id=m["allocation_id"], **{key: m[key] for key in MINUTE_FIELDS})
        for m in minutes
        if m["allocation_id"] in own
    ]
    GpuMinute.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


PRUNE_BATCH = 5000  # minutes per transaction: a big backlog never holds its locks for long
# Named as the summary's fields; the weighted sum comes first, before "samples" names the sum and not the field.
_FOLD = {
    "utilisation_weighted": Sum(F("utilisation_avg") * F("samples")), "minutes": Count("id"),
    "through": Max("minute"), "samples": Sum("samples"), "utilisation_max": Max("utilisation_max"),
    "memory_used_max_bytes": Max("memory_used_max_bytes"), "power_sum_w": Sum("power_avg_w"),
    "power_minutes": Count("power_avg_w"), "temperature_max_c": Max("temperature_max_c"),
}  # fmt: skip
_SUMMED = ("minutes", "samples", "utilisation_weighted", "power_sum_w", "power_minutes")


def prune_gpu_minutes(*, now: datetime, keep_days: int, batch: int = PRUNE_BATCH) -> int:
    """Folds GPU minutes older than ``keep_days`` into their allocations' summaries, then deletes them;
    how many went. One short transaction per ``batch``: the agents keep writing meanwhile."""
    cutoff, pruned = now - timedelta(days=keep_days), 0
    while folded := _fold_batch(cutoff=cutoff, batch=batch):
        pruned += folded
    return pruned


@transaction.atomic
def _fold_batch(*, cutoff: datetime, batch: int) -> int:
    # Locked (and skipped by a concurrent pruner): a minute is folded exactly once.
    old = GpuMinute.objects.filter(minute__lt=cutoff).order_by("id").select_for_update(skip_locked=True)
    ids = list(old.values_list("id", flat=True)[:batch])
    if not ids:
        return 0
    folded = GpuMinute.objects.filter(id__in=ids).values("allocation_id").annotate(**_FOLD).order_by()
    by_allocation = {row.pop("allocation_id"): row for row in folded}
    existing = GpuUseSummary.objects.select_for_update().in_bulk(list(by_allocation))
    fresh = [
        GpuUseSummary(allocation_id=a, **_clean(row)) for a, row in by_allocation.items() if a not in existing
    ]
    for allocation_id, summary in existing.items():
        _add(summary, by_allocation[allocation_id])
    GpuUseSummary.objects.bulk_create(fresh)
    GpuUseSummary.objects.bulk_update(existing.values(), list(_FOLD))
    GpuMinute.objects.filter(id__in=ids).delete()
    return len(ids)


def _clean(row: dict) -> dict:
    return {**row, "power_sum_w": row["power_sum_w"] or 0.0}


def _add(summary: GpuUseSummary, row: dict) -> None:
    """Adds a batch's folded minutes to a summary: counts and sums add up, peaks keep the higher."""
    for name, value in _clean(row).items():
        have = getattr(summary, name)
        if name in _SUMMED:
            setattr(summary, name, have + value)
        elif value is not None and (have is None or value > have):
            setattr(summary, name, value)
