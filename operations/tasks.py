"""Beat's periodic edges for the dashboard: each calls one service with the current time."""

from celery import shared_task
from django.utils import timezone

from operations import services


@shared_task
def beat_heartbeat() -> None:
    services.beat_heartbeat(now=timezone.now())


@shared_task
def sample_utilisation() -> None:
    services.sample_utilisation(now=timezone.now())


@shared_task
def check_ledger() -> None:
    services.check_ledger(now=timezone.now())
