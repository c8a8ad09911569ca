"""A webhook whose receiver never answers is paused: its deliveries stop holding the notification workers.

Found by review: a team with 10 webhooks on a server that accepts connections and never answers, and one
1,000-task array cancelled, owed 10,000 deliveries; each try held a notification thread for the whole
E31_WEBHOOK_TIMEOUT_S (10 s), about 3.5 hours of the README's 8 threads for the first tries alone, while every
other team's webhooks and e-mails waited behind them on the one queue. After WEBHOOK_SILENT_TRIES tries in a
row that got no answer (or one after more than half the timeout), the webhook's deliveries wait
E31_WEBHOOK_PAUSE_S untried (no attempt counted), then one more try decides: a prompt answer of any kind resumes it.
"""

import socket
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cryptography.fernet import Fernet
from django.db import connection
from django.utils import timezone

from notifications import services as notify
from notifications.models import WebhookAttempt, WebhookDelivery
from tests.factories import JobFactory, WebhookFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def silent_receiver():
    """Accepts every connection and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    held, stop = [], threading.Event()

    def accept() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/hook"
    stop.set()
    for conn in held:
        conn.close()
    sock.close()


def _owed(team, url: str, count: int) -> list[WebhookDelivery]:
    webhook = WebhookFactory(team=team, url=url, secret="s3cret-s3cret-s3cret", created_at=timezone.now())
    now = timezone.now()
    return [
        WebhookDelivery.objects.create(
            webhook=webhook,
            event_key=f"job:{i}",
            event="ended",
            job=JobFactory(team=team),
            payload={},
            next_attempt_at=now,
            created_at=now,
        )
        for i in range(count)
    ]


def test_a_webhook_that_never_answers_is_paused_and_its_deliveries_wait_untried(
    team, silent_receiver, loopback_allowed, settings
):
    settings.E31_WEBHOOK_TIMEOUT_S = 0.3
    deliveries = _owed(team, silent_receiver, notify.WEBHOOK_SILENT_TRIES + 3)
    now = timezone.now()
    tried = deliveries[: notify.WEBHOOK_SILENT_TRIES]
    assert [notify.deliver_webhook(delivery_id=d.id, now=now) for d in tried] == ["pending"] * len(tried)

    started = time.monotonic()
    rest = [notify.deliver_webhook(delivery_id=d.id, now=now) for d in deliveries[len(tried) :]]
    assert rest == ["paused"] * 3 and time.monotonic() - started < 0.3  # no connection made
    assert WebhookAttempt.objects.count() == len(tried)
    resume_at = now + timedelta(seconds=settings.E31_WEBHOOK_PAUSE_S)
    for delivery in deliveries[len(tried) :]:
        delivery.refresh_from_db()
        assert (delivery.attempts, delivery.next_attempt_at) == (0, resume_at)


def test_a_paused_webhook_resumes_once_its_receiver_answers(team, receiver, loopback_allowed, settings):
    deliveries = _owed(team, receiver.url, 2)
    webhook = deliveries[0].webhook
    paused_until = timezone.now() + timedelta(seconds=60)
    type(webhook).objects.filter(id=webhook.id).update(
        silent_tries=notify.WEBHOOK_SILENT_TRIES, paused_until=paused_until
    )
    assert notify.deliver_webhook(delivery_id=deliveries[0].id, now=timezone.now()) == "paused"
    later = paused_until + timedelta(seconds=1)
    assert notify.deliver_webhook(delivery_id=deliveries[0].id, now=later) == "delivered"
    webhook.refresh_from_db()
    assert (webhook.silent_tries, webhook.paused_until) == (0, None)
    assert notify.deliver_webhook(delivery_id=deliveries[1].id, now=later) == "delivered"


def test_a_receiver_that_answers_with_errors_is_never_paused(team, receiver, loopback_allowed):
    """A prompt answer, even a 500, holds a worker a moment: only silence, or a late answer, pauses."""
    receiver.statuses = [500]
    deliveries = _owed(team, receiver.url, notify.WEBHOOK_SILENT_TRIES + 2)
    now = timezone.now()
    assert {notify.deliver_webhook(delivery_id=d.id, now=now) for d in deliveries} == {"pending"}


def test_the_webhooks_page_says_a_webhook_is_paused_and_why(team, member_client, receiver):
    [delivery] = _owed(team, receiver.url, 1)
    type(delivery.webhook).objects.filter(id=delivery.webhook_id).update(
        silent_tries=5, paused_until=timezone.now() + timedelta(minutes=10)
    )
    page = member_client.get(f"/notifications/webhooks/{team.slug}/").content.decode()
    assert "paused" in page and "did not answer 5 tries in a row" in page


@pytest.mark.django_db(transaction=True)
def test_when_a_pause_ends_one_try_decides_while_the_other_deliveries_wait(
    team, silent_receiver, loopback_allowed, settings
):
    """From the review: at the pause's end every delivery held was due at once, and each free worker sent its own
    try into the silence. One probe goes; the others wait for what it finds."""
    settings.E31_WEBHOOK_TIMEOUT_S = 1.0
    deliveries = _owed(team, silent_receiver, 4)
    webhook = deliveries[0].webhook
    type(webhook).objects.filter(id=webhook.id).update(
        silent_tries=notify.WEBHOOK_SILENT_TRIES, paused_until=timezone.now() - timedelta(seconds=1)
    )
    now, answers = timezone.now(), {}

    def deliver(delivery: WebhookDelivery) -> None:
        try:
            answers[delivery.id] = notify.deliver_webhook(delivery_id=delivery.id, now=now)
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver, args=(d,)) for d in deliveries]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(answers.values()) == ["paused", "paused", "paused", "pending"]
    assert WebhookAttempt.objects.count() == 1
    webhook.refresh_from_db()
    assert webhook.paused_until >= now + timedelta(seconds=settings.E31_WEBHOOK_PAUSE_S)  # paused again


def test_a_secret_the_platform_cannot_open_is_no_silence_of_the_receiver(
    team, receiver, loopback_allowed, settings
):
    """The platform's own key problem is said on the try; it never pauses the team's webhook as the receiver's."""
    settings.E31_SECRETS_KEYS = [Fernet.generate_key().decode()]
    deliveries = _owed(team, receiver.url, notify.WEBHOOK_SILENT_TRIES + 1)
    settings.E31_SECRETS_KEYS = [Fernet.generate_key().decode()]  # the key it was sealed under was dropped
    now = timezone.now()
    assert {notify.deliver_webhook(delivery_id=d.id, now=now) for d in deliveries} == {"pending"}
    webhook = deliveries[0].webhook
    webhook.refresh_from_db()
    assert (webhook.silent_tries, webhook.paused_until) == (0, None)


@pytest.fixture
def slow_receiver():
    """Answers 200, or 500 once ``status`` is set, 0.3 s after each request."""

    class Slow(BaseHTTPRequestHandler):
        status = 200

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            time.sleep(0.3)
            self.send_response(Slow.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Slow, f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("status", [200, 500])
def test_a_receiver_that_answers_just_before_the_timeout_is_paused_like_a_silent_one(
    team, slow_receiver, loopback_allowed, settings, status
):
    """Found by review: a receiver answering (500, or even 200) just inside E31_WEBHOOK_TIMEOUT_S held a worker
    for nearly the whole timeout each try and was never paused: an answer of any kind resumed it. A try answered
    after more than half the timeout now counts as one with no answer."""
    handler, url = slow_receiver
    handler.status = status
    settings.E31_WEBHOOK_TIMEOUT_S = 0.4
    deliveries = _owed(team, url, notify.WEBHOOK_SILENT_TRIES + 2)
    now = timezone.now()
    tried = [notify.deliver_webhook(delivery_id=d.id, now=now) for d in deliveries]
    answered = "delivered" if status == 200 else "pending"
    assert tried == [answered] * notify.WEBHOOK_SILENT_TRIES + ["paused"] * 2
    webhook = deliveries[0].webhook
    webhook.refresh_from_db()
    assert webhook.paused_until == now + timedelta(seconds=settings.E31_WEBHOOK_PAUSE_S)
