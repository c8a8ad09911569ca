"""Utilisation samples: what the pool did each minute, measured here, written by beat through
``operations.services.sample_utilisation``, and read here by the charts.

Definitions (per sampled minute, over nodes not down):

- **busy**: GPUs held by an active allocation.
- **reserved**: GPUs free now that the scheduling policy counts on for a reservation. The
  sampler runs ``jobs.scheduling.policy.plan`` read-only over the same snapshot a scheduler pass
  reads (``jobs.snapshot.take``), and counts the reservations' GPUs that are free at that instant;
  nothing is started or stored by it but the sample.
- **idle while waiting**: the other free GPUs of schedulable (up) nodes while at least one job is
  queued and ready: the waste a scheduler should drive to zero. With no job ready, it is 0.
- **other idle**: the rest (free with nothing ready to use it, or on a draining/drained node).

The charts are built from these rows alone, aggregated in SQL by bucket, so they cost the same
whatever the pool's size.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import Avg, BigIntegerField, Count, ExpressionWrapper, F, Sum, Value

from jobs.scheduling import types
from operations.models import TeamBusySample, UtilisationSample


@dataclass(frozen=True)
class Figures:
    total: int
    busy: int
    reserved: int
    idle_while_waiting: int
    queued: int
    reservations: dict[str, dict]


@dataclass(frozen=True)
class Window:
    """A chart's time range and its bucket width, in whole minutes."""

    key: str
    label: str
    span: timedelta
    bucket_minutes: int


WINDOWS = {
    w.key: w
    for w in (
        Window("24h", "last 24 hours", timedelta(hours=24), 10),
        Window("7d", "last 7 days", timedelta(days=7), 60),
        Window("30d", "last 30 days", timedelta(days=30), 240),
    )
}


# Samples older than this are deleted as new ones are written: the longest chart is 30 days, and
# the ledger, not these samples, is the lasting record of GPU-time.
RETENTION = timedelta(days=35)


def minute_of(at: datetime) -> int:
    return int(at.timestamp() // 60)


def at_minute(minute: int) -> datetime:
    return datetime.fromtimestamp(minute * 60, UTC)


# --------------------------------------------------------------------------- measuring


def measure(
    *, nodes: Iterable[types.NodeView], pending: Iterable[types.PendingJob], plan: types.Plan
) -> Figures:
    """The minute's figures from the snapshot and the plan (pure: see the module docstring)."""
    nodes = list(nodes)
    free_now = {(n.name, i) for n in nodes if n.schedulable for i in n.free}
    reserved = {
        (node, i)
        for r in plan.reservations
        for node, indices in (r.gpus_by_node or {}).items()
        for i in indices
        if (node, i) in free_now
    }
    queued = sum(1 for p in pending if p.ready_at is None)
    return Figures(
        total=sum(n.gpus for n in nodes),
        busy=sum(n.gpus - len(n.free) for n in nodes),
        reserved=len(reserved),
        idle_while_waiting=len(free_now) - len(reserved) if queued else 0,
        queued=queued,
        reservations={str(r.job_id): _reservation(r) for r in plan.reservations},
    )


def _reservation(r: types.Reservation) -> dict:
    nodes = {node: list(ix) for node, ix in (r.gpus_by_node or {}).items()}
    return {"start_at": datetime.fromtimestamp(r.start_at, UTC).isoformat(), "gpus_by_node": nodes}


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class PoolBucket:
    """Mean GPUs per state over one bucket's samples."""

    minute: int  # the bucket's first minute (whole minutes since the epoch)
    total: float
    busy: float
    reserved: float
    idle_while_waiting: float
    samples: int

    @property
    def other_idle(self) -> float:
        return max(0.0, self.total - self.busy - self.reserved - self.idle_while_waiting)


def latest() -> UtilisationSample | None:
    return UtilisationSample.objects.order_by("-minute").first()


def _bucketed(queryset, *, window: Window, now: datetime):
    until = minute_of(now) + 1
    since = until - int(window.span.total_seconds() // 60)
    # Integer division on both databases: each row's bucket is the index of its slot.
    bucket = ExpressionWrapper(F("minute") / Value(window.bucket_minutes), output_field=BigIntegerField())
    return queryset.filter(minute__gte=since, minute__lt=until).annotate(bucket=bucket)


def pool_series(*, window: Window, now: datetime) -> list[PoolBucket]:
    """One bucket per slot with samples, oldest first (one query)."""
    rows = (
        _bucketed(UtilisationSample.objects.all(), window=window, now=now)
        .values("bucket")
        .annotate(
            total=Avg("total_gpus"),
            busy=Avg("busy_gpus"),
            reserved=Avg("reserved_gpus"),
            idle=Avg("idle_while_waiting_gpus"),
            n=Count("id"),
        )
        .order_by("bucket")
    )
    return [
        PoolBucket(
            r["bucket"] * window.bucket_minutes, r["total"], r["busy"], r["reserved"], r["idle"], r["n"]
        )
        for r in rows
    ]


def team_series(*, window: Window, now: datetime) -> dict[int, dict[int, float]]:
    """GPU-hours per team per bucket: {team id: {bucket start minute: GPU-hours}} (one query).

    Each sample stands for one minute, so a bucket's GPU-hours are its GPU-minutes / 60.
    """
    rows = (
        _bucketed(TeamBusySample.objects.all(), window=window, now=now)
        .values("bucket", "team_id")
        .annotate(gpu_minutes=Sum("busy_gpus"))
        .order_by()
    )
    out: dict[int, dict[int, float]] = {}
    for r in rows:
        out.setdefault(r["team_id"], {})[r["bucket"] * window.bucket_minutes] = r["gpu_minutes"] / 60
    return out


def slots(*, window: Window, now: datetime) -> list[int]:
    """Every bucket's start minute in the window, oldest first, samples or not (gaps show as gaps)."""
    until = minute_of(now) + 1
    first = (until - int(window.span.total_seconds() // 60)) // window.bucket_minutes
    last = (until - 1) // window.bucket_minutes
    return [b * window.bucket_minutes for b in range(first, last + 1)]
