"""Celery edges: each takes ids, calls one service of the same name, and is safe to run twice.

Writers enqueue these by name through ``jobs.dispatch`` (its names are checked against these).
"""

from datetime import datetime

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from jobs import agent, delivery_threads, gpu_usage, logs, nodes, reconciler, scheduler, staging

# Set by the node_agent command: how this agent runs jobs ("bubblewrap" or "none"), as whom, and its
# GPUs' UUIDs by device index.
AGENT: dict = {"mode": "", "uids": None, "gpu_uuids": {}, "node": None}


@shared_task(acks_late=True, reject_on_worker_lost=True)
def stage_job(job_id: int, claim: str = "") -> None:
    """``claim``: the hand-over a stager that gave its thread back left on the job (``dispatch.restage_job``)."""
    resumed = datetime.fromisoformat(claim) if claim else None
    staging.stage_job(job_id=job_id, now=timezone.now(), resume_from=resumed)


@shared_task(acks_late=True)
def run_requested_passes() -> None:
    scheduler.run_requested_passes(clock=timezone.now)


@shared_task(acks_late=True)
def run_safety_pass() -> None:
    scheduler.run_safety_pass(now=timezone.now())


@shared_task(acks_late=True, reject_on_worker_lost=True)
def run_part(allocation_id: int) -> None:
    agent.run_part(
        allocation_id=allocation_id,
        mode=AGENT["mode"],
        uids=AGENT["uids"],
        gpu_uuids=AGENT["gpu_uuids"],
        node_name=AGENT["node"],
    )


@shared_task(acks_late=True, reject_on_worker_lost=True)
def deliver_part(allocation_id: int) -> None:
    # On threads of its own: the worker's are for the GPUs' parts.
    delivery_threads.deliver_part(allocation_id)


@shared_task
def reap_silent_nodes() -> None:
    nodes.reap_silent_nodes(now=timezone.now())


@shared_task
def reconcile() -> None:
    reconciler.reconcile(now=timezone.now())


@shared_task
def prune_gpu_minutes() -> None:
    """Per-minute GPU detail is kept E31_GPU_MINUTES_KEEP_DAYS; each allocation keeps its summary."""
    gpu_usage.prune_gpu_minutes(now=timezone.now(), keep_days=settings.E31_GPU_MINUTES_KEEP_DAYS)


@shared_task
def prune_logs() -> None:
    """Job logs are kept E31_LOG_KEEP_DAYS after their job ends; the job, its events and its ledger stay."""
    logs.prune_logs(now=timezone.now(), keep_days=settings.E31_LOG_KEEP_DAYS)


@shared_task
def sweep_cache() -> None:
    """Retention and capacity hold while the pool is idle too, not only when a job stages."""
    staging.sweep_cache(now=timezone.now())
