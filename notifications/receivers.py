"""Listens to jobs' events (jobs never imports this app)."""

from datetime import datetime

from django.dispatch import receiver

from jobs import signals
from notifications import services


@receiver(signals.job_event)
def record_job_event(
    sender, *, job_id: int, event: str, attempt: int, now: datetime, detail: str = "", **_
) -> None:
    services.record_job_event(job_id=job_id, event=event, attempt=attempt, now=now, detail=detail)
