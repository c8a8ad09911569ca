"""What the GPUs did: each GPU's latest reading (the pool page) and per-minute summaries of allocated GPUs.

Written by the node agents' samplers. Metrics, not the meter: a lost minute leaves a gap in a chart,
never in the ledger, so a summary already stored (an agent retrying after a database error) is kept.
"""

from collections.abc import Mapping, Sequence
from datetime import datetime

from jobs.models import Allocation, GpuMinute, NodeGpu

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
