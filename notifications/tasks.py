"""Celery edges: ids in, one service of the same name; safe to run twice."""

from celery import shared_task
from django.utils import timezone

from notifications import services


@shared_task(acks_late=True)
def deliver_webhook(delivery_id: int) -> None:
    services.deliver_webhook(delivery_id=delivery_id, now=timezone.now())


@shared_task(acks_late=True)
def send_job_email(job_id: int) -> None:
    services.send_job_email(job_id=job_id, now=timezone.now())


@shared_task
def send_due_notifications() -> None:
    services.send_due_notifications(now=timezone.now())
