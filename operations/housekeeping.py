"""Housekeeping: rows that pile up with use and serve no one past their time are removed in short batches.

Expired sessions, webhook deliveries finished more than E31_WEBHOOK_KEEP_DAYS ago (with their tries) and
Idempotency-Keys past their lifetime. Job logs are bounded beside the log code (``jobs.logs.prune_logs``),
GPU minutes beside theirs. Records are never touched here: the ledger, the audit log and job events are kept.
Each batch deletes only rows still past their time in the same statement, so a row refreshed meanwhile
(a session used again) stays.
"""

from datetime import datetime, timedelta

from django.contrib.sessions.models import Session
from django.db.models import Model, Q, QuerySet

from jobs import idempotency
from jobs.models import SubmissionKey
from notifications.models import WebhookDelivery

BATCH = 1000  # rows per statement: a backlog (the first run after an upgrade) never holds locks for long


def clear_expired_sessions(*, now: datetime, batch: int = BATCH) -> int:
    """Removes sessions expired before ``now`` (Django's ``clearsessions``, batched); how many went."""
    return _delete_in_batches(Session.objects.filter(expire_date__lt=now), batch=batch)


def prune_webhook_deliveries(*, now: datetime, keep_days: int, batch: int = BATCH) -> int:
    """Removes deliveries delivered or given up more than ``keep_days`` before ``now``, and their tries.
    One still being tried is kept whatever its age: removing it would lose the event."""
    finished = Q(state__in=[WebhookDelivery.DELIVERED, WebhookDelivery.FAILED])
    old = WebhookDelivery.objects.filter(finished, finished_at__lt=now - timedelta(days=keep_days))
    return _delete_in_batches(old, batch=batch)


def forget_submission_keys(*, now: datetime, batch: int = BATCH) -> int:
    """Removes Idempotency-Keys past their lifetime: a retry with one would already get a new job."""
    old = SubmissionKey.objects.filter(created_at__lte=now - idempotency.KEY_LIFETIME)
    return _delete_in_batches(old, batch=batch)


def _delete_in_batches(rows: QuerySet[Model], *, batch: int) -> int:
    removed = 0
    while keys := list(rows.order_by("pk").values_list("pk", flat=True)[:batch]):
        # The filter again, not the keys alone: a row that left it since the read (renewed) is kept.
        _, by_model = rows.filter(pk__in=keys).delete()  # with what cascades (a delivery's tries)
        removed += by_model.get(rows.model._meta.label, 0)
    return removed
