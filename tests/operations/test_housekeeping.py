"""Beat's housekeeping: expired sessions, finished webhook deliveries past their days and forgotten
Idempotency-Keys are removed; a live session, a delivery still being tried and a key still in use are kept."""

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.test import Client
from django.urls import reverse

from jobs import idempotency
from jobs.models import SubmissionKey
from notifications.models import Webhook, WebhookAttempt, WebhookDelivery
from operations import housekeeping, tasks
from tests.factories import JobFactory, WebhookFactory

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _session(expires: datetime) -> str:
    store = SessionStore()
    store["seen"] = True
    store.create()
    Session.objects.filter(session_key=store.session_key).update(expire_date=expires)
    return store.session_key


def test_expired_sessions_are_cleared_and_live_ones_kept():
    expired = [_session(NOW - timedelta(hours=h)) for h in (1, 24, 24 * 400)]
    live = _session(NOW + timedelta(hours=1))
    assert housekeeping.clear_expired_sessions(now=NOW, batch=2) == 3
    assert list(Session.objects.values_list("session_key", flat=True)) == [live]
    assert not Session.objects.filter(session_key__in=expired).exists()


def test_a_signed_in_member_stays_signed_in_through_the_clearing(member):
    client = Client()
    client.force_login(member)
    _session(NOW - timedelta(days=3))
    housekeeping.clear_expired_sessions(now=NOW)  # the member's session expires in the future of NOW
    assert client.get(reverse("jobs:list")).status_code == 200
    assert Session.objects.count() == 1


def _delivery(hook: Webhook, key: str, *, state: str, finished: datetime | None) -> WebhookDelivery:
    created = (finished or NOW) - timedelta(minutes=5)
    delivery = WebhookDelivery.objects.create(
        webhook=hook, event_key=key, event="ended", job=JobFactory(team=hook.team), payload={}, state=state,
        attempts=1, next_attempt_at=created, created_at=created, finished_at=finished,
    )  # fmt: skip
    WebhookAttempt.objects.create(delivery=delivery, number=1, at=created, status=500, response="no")
    return delivery


@pytest.fixture
def hook(team):
    return WebhookFactory(team=team, url="https://hooks.example/", secret="x" * 20, created_at=NOW)


def test_finished_webhook_deliveries_past_their_days_go_with_their_tries(hook):
    old_ok = _delivery(hook, "a", state="delivered", finished=NOW - timedelta(days=31))
    old_failed = _delivery(hook, "b", state="failed", finished=NOW - timedelta(days=45))
    recent = _delivery(hook, "c", state="delivered", finished=NOW - timedelta(days=29))
    # Still being tried (a receiver down a long while): kept whatever its age, so it is not lost.
    pending = _delivery(hook, "d", state="pending", finished=None)
    WebhookDelivery.objects.filter(id=pending.id).update(created_at=NOW - timedelta(days=90))
    assert housekeeping.prune_webhook_deliveries(now=NOW, keep_days=30, batch=1) == 2
    assert set(WebhookDelivery.objects.values_list("id", flat=True)) == {recent.id, pending.id}
    assert not WebhookAttempt.objects.filter(delivery_id__in=[old_ok.id, old_failed.id]).exists()
    assert WebhookAttempt.objects.filter(delivery_id__in=[recent.id, pending.id]).count() == 2


def test_idempotency_keys_past_their_lifetime_are_forgotten_and_live_ones_still_answer(member, team):
    def key(name: str, age: timedelta) -> SubmissionKey:
        return SubmissionKey.objects.create(
            user=member, key=name, body_sha256="0" * 64, job=JobFactory(team=team), created_at=NOW - age
        )

    key("old", idempotency.KEY_LIFETIME + timedelta(seconds=1))
    live = key("live", idempotency.KEY_LIFETIME - timedelta(minutes=1))
    assert housekeeping.forget_submission_keys(now=NOW) == 1
    assert list(SubmissionKey.objects.values_list("key", flat=True)) == ["live"]
    assert idempotency.earlier_job(user=member, key="live", body_sha256="0" * 64, now=NOW) == live.job


def test_beat_runs_each_housekeeping_pass_with_the_settings_days(hook, settings, time_machine):
    scheduled = {e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {
        "operations.tasks.clear_expired_sessions",
        "operations.tasks.prune_webhook_deliveries",
        "operations.tasks.forget_submission_keys",
    } <= scheduled
    time_machine.move_to(NOW, tick=False)
    _delivery(hook, "a", state="delivered", finished=NOW - timedelta(days=20))
    expired = _session(NOW - timedelta(minutes=1))
    settings.E31_WEBHOOK_KEEP_DAYS = 30
    tasks.prune_webhook_deliveries()
    assert WebhookDelivery.objects.count() == 1
    settings.E31_WEBHOOK_KEEP_DAYS = 14
    tasks.prune_webhook_deliveries()
    tasks.clear_expired_sessions()
    tasks.forget_submission_keys()
    assert not WebhookDelivery.objects.exists() and not Session.objects.filter(session_key=expired).exists()


@pytest.mark.django_db(False)
def test_a_webhook_keep_below_one_day_is_refused_at_start():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "e31web.settings", "E31_WEBHOOK_KEEP_DAYS": "0"}
    started = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert started.returncode != 0 and "ImproperlyConfigured: E31_WEBHOOK_KEEP_DAYS" in started.stderr
