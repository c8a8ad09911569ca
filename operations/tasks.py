"""Beat's periodic edges for the dashboard and the housekeeping: each calls one writer with the current time."""

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from operations import housekeeping, services


@shared_task
def beat_heartbeat() -> None:
    services.beat_heartbeat(now=timezone.now())


@shared_task
def sample_utilisation() -> None:
    services.sample_utilisation(now=timezone.now())


@shared_task
def check_ledger() -> None:
    services.check_ledger(now=timezone.now())


@shared_task
def clear_expired_sessions() -> None:
    housekeeping.clear_expired_sessions(now=timezone.now())


@shared_task
def prune_webhook_deliveries() -> None:
    housekeeping.prune_webhook_deliveries(now=timezone.now(), keep_days=settings.E31_WEBHOOK_KEEP_DAYS)


@shared_task
def forget_submission_keys() -> None:
    housekeeping.forget_submission_keys(now=timezone.now())
