"""Webhooks and e-mails go out on a queue of their own: a team's receiver that never answers holds no control thread.

A webhook try may last E31_WEBHOOK_TIMEOUT_S (10 s). On the control queue, served by a worker of 4 threads, a
team whose receiver accepts connections and never answers held all four with four events: every other team's
scheduler passes, the reaper, the reconciler and the meter waited behind it.
"""

import logging
import threading
import time
import uuid

import celery
import pytest
from celery.contrib.testing.worker import start_worker
from django.conf import settings as django_settings
from django.utils import timezone

import notifications.tasks  # noqa: F401 - registers the tasks on the app
from jobs import dispatch, nodes
from notifications import services as notify
from notifications.models import WebhookDelivery
from tests.factories import JobFactory, WebhookFactory

pytestmark = [pytest.mark.timeout(120), pytest.mark.django_db(transaction=True)]


def test_a_dead_node_is_still_reaped_while_four_webhooks_hang(settings, monkeypatch, team):
    if not django_settings.CELERY_BROKER_URL.startswith("redis://"):
        pytest.fail("needs the Redis broker (CELERY_BROKER_URL=redis://…; make test sets it)")
    app = celery.current_app
    control = settings.CELERY_TASK_DEFAULT_QUEUE = f"control-{uuid.uuid4().hex[:8]}"
    release, tried, reaped = threading.Event(), [], []

    def hung_receiver(*, delivery_id, now):  # a receiver that accepts and never answers holds a try this long
        tried.append(delivery_id)
        release.wait(60)

    monkeypatch.setattr(notify, "deliver_webhook", hung_receiver)
    monkeypatch.setattr(nodes, "reap_silent_nodes", lambda *, now: reaped.append(time.monotonic()))
    _deliveries_due(team, 4)
    beat = django_settings.CELERY_BEAT_SCHEDULE["reap-silent-nodes"]
    try:
        with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False, queues=[control],
                          without_heartbeat=True, shutdown_timeout=30):  # fmt: skip
            assert notify.send_due_notifications(now=timezone.now()) == 4  # beat's sweep rings for each
            app.send_task(beat["task"], queue=control, **beat["options"])  # beat's pass, as beat sends it
            deadline = time.monotonic() + 15
            while not reaped and time.monotonic() < deadline:
                time.sleep(0.1)
        assert reaped, "the reaper's pass waited behind the webhooks"
        assert tried == [], "the control worker took the webhooks"
        assert dispatch.notify_queue() == f"{control}.notify"
    finally:
        release.set()
        with app.connection_for_write() as conn:
            client = conn.default_channel.client
            for queue in (control, f"{control}.notify"):
                conn.default_channel.queue_delete(queue)
                for key in client.keys(f"*{queue}*"):
                    client.delete(key)


def test_the_sweep_stops_ringing_while_no_worker_takes_the_notifications(settings, monkeypatch, team, caplog):
    """A deployment upgraded without a notification worker: every 5 s beat's sweep rang again for every delivery
    due, and the unconsumed queue grew by up to 200 messages a second until the broker's memory ran out. Past
    NOTIFY_BACKLOG waiting, the sweep rings for nothing and says why."""
    if not django_settings.CELERY_BROKER_URL.startswith("redis://"):
        pytest.fail("needs the Redis broker (CELERY_BROKER_URL=redis://…; make test sets it)")
    app = celery.current_app
    control = settings.CELERY_TASK_DEFAULT_QUEUE = f"control-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(notify, "NOTIFY_BACKLOG", 3)
    _deliveries_due(team, 2)
    # Heard whatever logging a worker started earlier in the run left set up (it may disable existing loggers).
    caplog.set_level(logging.WARNING, logger=notify.log.name)
    monkeypatch.setattr(notify.log, "disabled", False)
    notify.log.addHandler(caplog.handler)
    try:
        assert notify.send_due_notifications(now=timezone.now()) == 2  # 2 waiting
        assert (
            notify.send_due_notifications(now=timezone.now()) == 2
        )  # 4 waiting: past the backlog from now on
        assert notify.send_due_notifications(now=timezone.now()) == 0
        assert dispatch.queue_depth(dispatch.notify_queue()) == 4
        assert (
            "4 notifications wait on the queue" in caplog.text
            and "-Q " + dispatch.notify_queue() in caplog.text
        )
    finally:
        notify.log.removeHandler(caplog.handler)
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(f"{control}.notify")


def _deliveries_due(team, count: int) -> None:
    """``count`` webhook deliveries of ``team``, due now."""
    hook = WebhookFactory(
        team=team, url="https://hooks.example/e31", secret="x" * 20, created_at=timezone.now()
    )
    for i in range(count):
        WebhookDelivery.objects.create(
            webhook=hook, event_key=f"k{i}", event="ended", job=JobFactory(team=team), payload={},
            next_attempt_at=timezone.now(), created_at=timezone.now(),
        )  # fmt: skip
