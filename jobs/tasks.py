"""Celery edges: each takes ids, calls one service, and is safe to run twice."""

from celery import shared_task
from django.db import transaction
from django.utils import timezone

from jobs import agent, delivery, dispatch, nodes, reconciler, scheduler, staging

# Set by the node_agent command: how this agent runs jobs ("bubblewrap" or "none").
AGENT = {"mode": ""}


@shared_task(acks_late=True, reject_on_worker_lost=True)
def stage_job(job_id: int) -> None:
    staging.stage_job(job_id=job_id, now=timezone.now())


@shared_task(acks_late=True)
def schedule_pass() -> None:
    """Runs passes while requests keep arriving; requests made during a pass trigger one more."""
    for _ in range(20):
        with transaction.atomic():
            claimed = dispatch.claim_requested_pass()
        if not claimed:
            return
        scheduler.run_pass(now=timezone.now())


@shared_task(acks_late=True)
def safety_pass() -> None:
    dispatch.claim_requested_pass()
    scheduler.run_pass(now=timezone.now())
    nodes.settle_drains(now=timezone.now())


@shared_task(acks_late=True, reject_on_worker_lost=True)
def run_allocation(allocation_id: int) -> None:
    agent.run_part(allocation_id=allocation_id, mode=AGENT["mode"])


@shared_task(acks_late=True, reject_on_worker_lost=True)
def deliver_outputs(allocation_id: int) -> None:
    delivery.deliver_part(allocation_id=allocation_id, now=timezone.now())


@shared_task
def reap_nodes() -> None:
    nodes.reap_silent_nodes(now=timezone.now())


@shared_task
def reconcile() -> None:
    reconciler.reconcile(now=timezone.now())


@shared_task
def sweep_staging_cache() -> None:
    """Retention and capacity hold while the pool is idle too, not only when a job stages."""
    staging.sweep_cache(now=timezone.now())
