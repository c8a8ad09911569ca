"""/metrics: the pool's state for Prometheus, read from PostgreSQL at each scrape.

The console runs several gunicorn workers and Celery processes, so an in-process counter would say
something different in each: every value here is computed from the database when Prometheus asks, by a
collector registered on a registry of its own for that scrape (never the library's global one). A scrape
runs a fixed number of queries (13) whatever the size of the pool,
the queue or the history, through the pages' own reads where they exist. Labels stay bounded: per state,
per node, per probe; never per job or team, and no text a team wrote. prometheus_client writes the
exposition format, its escaping and its content type (the OpenMetrics text when a scraper asks for it).

Who may read it: a scraper sending ``Authorization: Bearer <E31_METRICS_TOKEN>``, and signed-in operators
in the browser. Everyone else gets 404, like the other operator pages, and so does everyone while no token
is configured (the endpoint is off). A scraper needs no cookie and no CSRF token: it only GETs. A client
address that has sent E31_METRICS_FAILURE_LIMIT wrong tokens in a clock-aligned window of
E31_METRICS_FAILURE_WINDOW_S gets 429 for every further wrong token until the window ends; the right token
is always served, so nobody sharing the scraper's address can keep the monitoring dark.
"""

import hmac
import math
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from django.conf import settings
from django.core.cache import cache
from django.db.models import Count, Exists, Min, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import Http404, HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_safe
from prometheus_client import CollectorRegistry, exposition
from prometheus_client.core import GaugeMetricFamily, Metric

from common import clients, denials, ratelimit
from jobs import selectors as jobs_selectors
from jobs.lifecycle import ALIVE, State
from jobs.models import Allocation, GpuHold, Job, Node, NodeGpu, OutputTransfer, SchedulerState
from metering import services as metering
from metering.models import MeterEntry
from metering.periods import HOUR, floor_hour
from notifications.models import WebhookAttempt, WebhookDelivery
from operations import pool, utilisation
from operations.models import HealthProbe

GPU_STATES = ("held", "reserved", "idle", "drained", "offline", "missing")
DRAINING = (Node.NodeState.DRAINING, Node.NodeState.DRAINED)


class NodeRow(NamedTuple):
    id: int
    name: str
    state: str
    gpus: int  # the GPUs it offers now (missing ones are not counted)
    last_heartbeat: datetime | None


def _age_s(at: datetime | None, now: datetime) -> float | None:
    # Never below 0: heartbeats carry the database's clock, a few milliseconds ahead of this process's at times.
    return None if at is None else max(0.0, (now - at).total_seconds())


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


# --------------------------------------------------------------------------- jobs


def job_families(now: datetime) -> Iterator[Metric]:
    """One grouped read over the (state, state_changed_at) index: counts, and when the oldest queued job queued.
    Live states only: the ended jobs are the history, which only grows, and counting them would read it all."""
    live = Job.objects.filter(state__in=ALIVE).order_by()
    rows = live.values("state").annotate(n=Count("id"), since=Min("state_changed_at"))
    by_state = {r["state"]: r for r in rows}
    jobs = GaugeMetricFamily("e31_jobs", "Jobs in each live lifecycle state.", labels=["state"])
    for state in (s for s in State if s in ALIVE):
        jobs.add_metric([state.value], by_state.get(state.value, {}).get("n", 0))
    yield jobs
    queued_since = by_state.get(State.QUEUED.value, {}).get("since")
    yield _gauge(
        "e31_queue_oldest_wait_seconds",
        "How long the job longest in the queue has waited for GPUs since it entered it (0: none waits).",
        _age_s(queued_since, now) or 0.0,
    )


# --------------------------------------------------------------------------- nodes and GPUs


def gpu_state(node: NodeRow, index: int, *, held: set, reserved: set) -> str:
    """One offered GPU's state, by the pool page's rule (``pool.gpu_state``); the page draws a draining node's
    unheld GPUs free or reserved beside the node's badge, a metric has no badge: they count as drained."""
    state = pool.gpu_state(
        present=True,
        held=(node.id, index) in held,
        node_state=node.state,
        reserved=(node.name, index) in reserved,
    )
    return "drained" if state in ("reserved", "idle") and node.state in DRAINING else state


def _reserved() -> set[tuple[str, int]]:
    """(node name, GPU index) the plan reserves for waiting jobs, as the latest utilisation sample recorded it."""
    sample = utilisation.latest()
    if sample is None:
        return set()
    return {
        (node, index)
        for r in sample.reservations.values()
        for node, indices in r["gpus_by_node"].items()
        for index in indices
    }


def node_families(now: datetime) -> Iterator[Metric]:
    in_service = Node.objects.filter(retired_at__isnull=True).order_by("name")  # a retired node is no series
    nodes = [NodeRow(*row) for row in in_service.values_list(*NodeRow._fields)]
    offered = jobs_selectors.present_gpus({n.id: n.gpus for n in nodes})  # the scheduler's read
    missing = dict(
        NodeGpu.objects.filter(present=False).order_by().values_list("node_id").annotate(n=Count("id"))
    )
    held = set(GpuHold.objects.filter(active=True).values_list("node_id", "gpu_index"))
    reserved = _reserved()
    gpus = GaugeMetricFamily("e31_node_gpus", "Each node's GPUs by state.", labels=["node", "state"])
    for node in nodes:
        counts = Counter(gpu_state(node, i, held=held, reserved=reserved) for i in offered[node.id])
        counts["missing"] = missing.get(node.id, 0)
        for state in GPU_STATES:
            gpus.add_metric([node.name, state], counts[state])
    yield gpus
    yield from _node_state_families(nodes, now)


def _node_state_families(nodes: list[NodeRow], now: datetime) -> Iterator[Metric]:
    counts = Counter(n.state for n in nodes)
    by_state = GaugeMetricFamily("e31_nodes", "Nodes in each state.", labels=["state"])
    for state in Node.NodeState.values:
        by_state.add_metric([state], counts[state])
    yield by_state
    ages = GaugeMetricFamily(
        "e31_node_heartbeat_age_seconds", "Seconds since each node's agent last beat.", labels=["node"]
    )
    for node in nodes:
        if node.last_heartbeat is not None:  # a node that never beat has no age, not an age of 0
            ages.add_metric([node.name], _age_s(node.last_heartbeat, now))
    yield ages
    yield _gauge(
        "e31_nodes_silent",
        "Live nodes (not down) whose agent has not beaten within E31_NODE_TIMEOUT_S: the reaper declares them down.",
        sum(1 for n in nodes if _silent(n, now)),
    )


def _silent(node: NodeRow, now: datetime) -> bool:
    """As the health page's agents check and the pool page's stale mark judge it."""
    age = _age_s(node.last_heartbeat, now)
    return node.state != Node.NodeState.DOWN and (age is None or age > settings.E31_NODE_TIMEOUT_S)


# --------------------------------------------------------------------------- scheduler, meter, probes


def scheduler_families(now: datetime) -> Iterator[Metric]:
    # Read, never made: jobs.dispatch.state_row() would create the row on a fresh database, and a scrape writes nothing.
    state = SchedulerState.objects.order_by("id").first()
    if state is None:
        return
    yield _gauge(
        "e31_scheduler_pass_requested",
        "1 while a scheduler pass has been asked for and no pass has taken the request yet.",
        int(state.pass_requested),
    )
    if state.last_pass_at is None:
        return
    yield _gauge("e31_scheduler_last_pass_age_seconds", "Seconds since the last scheduler pass.",
                 _age_s(state.last_pass_at, now))  # fmt: skip
    yield _gauge("e31_scheduler_last_pass_duration_seconds", "How long the last scheduler pass took.",
                 (state.last_pass_ms or 0.0) / 1000)  # fmt: skip
    yield _gauge("e31_scheduler_last_pass_started_jobs", "Jobs the last scheduler pass started.",
                 state.last_pass_started)  # fmt: skip


def accrual_lag_s(closed_through: datetime | None, now: datetime) -> float:
    """Seconds since the first UTC hour the ledger has not closed ended; 0 while none has (or nothing is held)."""
    if closed_through is None:
        return 0.0
    return max(0.0, (now - (floor_hour(closed_through) + HOUR)).total_seconds())


def meter_families(now: datetime) -> Iterator[Metric]:
    """The held allocation whose ledger trails furthest: its last metered row's end, or its RENT."""
    closed = (
        MeterEntry.objects.filter(allocation=OuterRef("pk"), kind__in=metering.METERED)
        .order_by("-period_start")
        .values("period_end")[:1]
    )
    held = Allocation.objects.filter(released_at__isnull=True)
    oldest = held.aggregate(at=Min(Coalesce(Subquery(closed), "rented_at")))["at"]
    yield _gauge(
        "e31_meter_accrual_lag_seconds",
        "Seconds since the first ended UTC hour of a held allocation that accrual has not closed into the "
        "ledger (0: every ended hour is closed). Up to E31_ACCRUE_EVERY_S + 60 s after each hour is normal.",
        accrual_lag_s(oldest, now),
    )


def probe_families(now: datetime) -> Iterator[Metric]:
    """The health page's stored checks (beat's heartbeat, the ledger check, the console's processes)."""
    probes = list(HealthProbe.objects.order_by("name").only("name", "ok", "at"))
    ok = GaugeMetricFamily("e31_probe_ok", "1 when the check's last result was good.", labels=["probe"])
    age = GaugeMetricFamily("e31_probe_age_seconds", "Seconds since the check last ran.", labels=["probe"])
    for probe in probes:
        ok.add_metric([probe.name], int(probe.ok))
        age.add_metric([probe.name], _age_s(probe.at, now))
    yield from (ok, age)


# --------------------------------------------------------------------------- transfers and webhooks


def _count_by(rows: QuerySet, field: str) -> dict[str, int]:
    """A selector's rows counted by one field in one query (its joins and ordering dropped)."""
    return dict(rows.order_by().values_list(field).annotate(n=Count("id")))


def transfer_families() -> Iterator[Metric]:
    staging = GaugeMetricFamily(
        "e31_staging_transfers",
        "Inputs of staging jobs being copied into the pool (staging) or waiting for a slot or another "
        "job's copy of the same data (waiting), datasets and images.",
        labels=["kind", "state"],
    )
    for kind, rows in (
        ("dataset", jobs_selectors.staging_in_flight()),
        ("image", jobs_selectors.images_in_flight()),
    ):
        counts = _count_by(rows, "stage_state")
        for state in ("staging", "waiting"):
            staging.add_metric([kind, state], counts.get(state, 0))
    yield staging
    delivering = _count_by(jobs_selectors.deliveries_in_flight(), "state")
    outputs = GaugeMetricFamily(
        "e31_output_transfers", "Output deliveries waiting for a slot or copying now.", labels=["state"]
    )
    for state in (OutputTransfer.WAITING, OutputTransfer.DELIVERING):
        outputs.add_metric([state], delivering.get(state, 0))
    yield outputs


def webhook_families(now: datetime) -> Iterator[Metric]:
    """Pending: no try answered yet; retrying: pending after a failed try; failed: out of tries (as kept)."""
    pending = Q(state=WebhookDelivery.PENDING)
    tried = Exists(WebhookAttempt.objects.filter(delivery=OuterRef("pk")))
    row = (
        WebhookDelivery.objects.filter(state__in=(WebhookDelivery.PENDING, WebhookDelivery.FAILED))
        .annotate(tried=tried)
        .aggregate(
            pending=Count("id", filter=pending & Q(tried=False)),
            retrying=Count("id", filter=pending & Q(tried=True)),
            failed=Count("id", filter=Q(state=WebhookDelivery.FAILED)),
            oldest=Min("created_at", filter=pending),
        )
    )
    deliveries = GaugeMetricFamily(
        "e31_webhook_deliveries", "Webhook deliveries not delivered, by state.", labels=["state"]
    )
    for state in ("pending", "retrying", "failed"):
        deliveries.add_metric([state], row[state])
    yield deliveries
    yield _gauge(
        "e31_webhook_oldest_pending_seconds",
        "Age of the oldest webhook event still to be delivered (0: none).",
        _age_s(row["oldest"], now) or 0.0,
    )


# --------------------------------------------------------------------------- the endpoint


@dataclass(frozen=True)
class PoolCollector:
    """prometheus_client's custom collector: everything read afresh at ``now``."""

    now: datetime

    def collect(self) -> Iterable[Metric]:
        yield from job_families(self.now)
        yield from node_families(self.now)
        yield from scheduler_families(self.now)
        yield from meter_families(self.now)
        yield from probe_families(self.now)
        yield from transfer_families()
        yield from webhook_families(self.now)


def render(*, now: datetime, accept: str) -> tuple[bytes, str]:
    """The exposition in the format the scraper accepts, and its content type."""
    registry = CollectorRegistry(auto_describe=False)  # no describe(): registering reads nothing
    registry.register(PoolCollector(now=now))
    encode, content_type = exposition.choose_encoder(accept)
    return encode(registry), content_type


def _failure_window(request: HttpRequest) -> tuple[str, int]:
    """The key of this client address's wrong tokens in the current clock-aligned window, and its seconds left."""
    period, now = settings.E31_METRICS_FAILURE_WINDOW_S, time.time()
    address = clients.client_network(request) or "unknown"
    return f"metrics-token-failed:{address}:{int(now // period)}", math.ceil(period - now % period)


def _refused_for_s(request: HttpRequest) -> int:
    """Seconds this address stays refused for its wrong tokens; 0 when it is not."""
    key, left = _failure_window(request)
    return left if cache.get(f"e31:refused:{key}") else 0


def _count_wrong_token(request: HttpRequest) -> None:
    """Only wrong tokens count: a scraper with the right one never adds to its address's count."""
    key, left = _failure_window(request)
    if ratelimit.hit(key, window_s=left) >= settings.E31_METRICS_FAILURE_LIMIT:
        # A flag in the shared cache (the limiter only counts up): past the limit a wrong token gets 429.
        cache.set(f"e31:refused:{key}", True, timeout=left)


def _token_matches(header: str, expected: str) -> bool:
    scheme, _, token = header.partition(" ")
    # On bytes: constant time whatever the two hold, and no TypeError for a header that is not ASCII.
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), expected.encode())


def may_read(request: HttpRequest) -> bool:
    """An operator's session when no Authorization header is sent; nobody when off. A token is checked first."""
    if not settings.E31_METRICS_TOKEN:
        return False
    if request.user.is_staff:
        return True
    if request.user.is_authenticated:
        denials.record(request, status=404, reason="not an operator")
    return False


@require_safe
def _metrics(request: HttpRequest) -> HttpResponse:
    body, content_type = render(now=timezone.now(), accept=request.headers.get("Accept", ""))
    return HttpResponse(body, content_type=content_type)


def _too_many_wrong_tokens(request: HttpRequest, retry_after_s: int) -> HttpResponse:
    denials.record(request, status=429, reason="too many wrong metrics tokens from this address")
    response = HttpResponse(
        "Too many wrong tokens from this address.\n", status=429, content_type="text/plain"
    )
    response["Retry-After"] = str(retry_after_s)
    return response


def metrics_view(request: HttpRequest) -> HttpResponse:
    """GET /metrics. Access first, so a refused visitor gets the same answer whatever the method.

    The token is compared before anything else, and the right one is always served: a flag on the address
    would let anyone sharing the scraper's address (NAT, an untrusted proxy) keep the monitoring dark with a
    few wrong tokens each window, while hiding a hit of a token this long protects little. A wrong token
    counts towards its address's limit, and past it gets 429 instead of 404."""
    expected, header = settings.E31_METRICS_TOKEN, request.headers.get("Authorization")
    if expected and header is not None:
        if _token_matches(header, expected):
            return _metrics(request)
        if retry_after_s := _refused_for_s(request):
            return _too_many_wrong_tokens(request, retry_after_s)
        denials.record(request, status=404, reason="not the metrics token")
        _count_wrong_token(request)
        raise Http404("No such page")
    if not may_read(request):
        raise Http404("No such page")
    return _metrics(request)
