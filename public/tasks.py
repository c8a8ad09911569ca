"""Celery edges: one service of the same name; safe to run twice."""

from celery import shared_task
from django.utils import timezone

from public import services


@shared_task
def tell_waitlist() -> None:
    services.tell_waitlist(now=timezone.now())
