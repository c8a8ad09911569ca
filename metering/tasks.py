"""Beat's hourly meter accrual. The service is idempotent, so a duplicated run adds nothing."""

from celery import shared_task
from django.utils import timezone

from metering import services


@shared_task(acks_late=True, reject_on_worker_lost=True)
def accrue_meter() -> int:
    return services.accrue_meter(now=timezone.now())
