"""Beat's hourly meter accrual. The service is idempotent, so a duplicated run adds nothing."""

from celery import shared_task

from jobs import clock
from metering import services


@shared_task(acks_late=True, reject_on_worker_lost=True)
def accrue_meter() -> int:
    # Dated by the database's clock, as agents date RENT and RELEASE: a beat machine's clock ahead would close an
    # hour before it ends, and a RELEASE is never dated before an hour its meter closed.
    return services.accrue_meter(now=clock.database_now())
