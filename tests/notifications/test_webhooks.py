"""Team webhooks: signed events on a job's start and end, retried with backoff, never to the platform."""

import json
import socket
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import services, transitions
from jobs.lifecycle import EndReason, State
from notifications import addresses, signing
from notifications import services as notify
from notifications.models import Webhook, WebhookAttempt, WebhookDelivery
from tests.factories import JobFactory, WebhookFactory

pytestmark = pytest.mark.django_db


def hook(team, url: str, secret: str = "s3cret-s3cret-s3cret") -> Webhook:
    return WebhookFactory(team=team, url=url, secret=secret, created_at=timezone.now())


def end(job, reason=EndReason.FAILED, now=None):
    """The job's release as the agent reports it (RUNNING -> RELEASED)."""
    return transitions.transition(
        job_id=job.id, source=State.RUNNING, target=State.RELEASED, now=now or timezone.now(),
        end_reason=reason, exit_code=3,
    )  # fmt: skip


def test_an_ended_job_sends_a_signed_event_enqueued_after_commit(
    team, receiver, loopback_allowed, django_capture_on_commit_callbacks
):
    webhook = hook(team, receiver.url)
    job = JobFactory(team=team, state="running")
    with django_capture_on_commit_callbacks() as callbacks:
        assert end(job)
        assert WebhookDelivery.objects.count() == 1 and receiver.requests == []  # nothing sent before commit
    assert len(callbacks) == 1
    delivery = WebhookDelivery.objects.get()
    assert notify.deliver_webhook(delivery_id=delivery.id, now=timezone.now()) == "delivered"
    path, headers, body = receiver.requests[0]
    assert path == "/hooks/e31"
    assert signing.verify(webhook.secret, headers, body, now=int(timezone.now().timestamp()))
    assert not signing.verify("another-secret-entirely", headers, body, now=int(timezone.now().timestamp()))
    event = json.loads(body)
    assert event["id"] == headers[signing.ID_HEADER] == str(delivery.event_id)
    assert (event["type"], event["job"]["id"], event["job"]["end_reason"], event["job"]["exit_code"]) == (
        "ended", job.id, "failed", 3,
    )  # fmt: skip
    attempt = WebhookAttempt.objects.get()
    assert (attempt.status, attempt.response) == (200, "thanks")


def test_a_500_is_retried_with_backoff_until_it_is_delivered(team, receiver, loopback_allowed, settings):
    settings.E31_WEBHOOK_BACKOFF_S = 10
    receiver.statuses = [500, 500, 200]
    hook(team, receiver.url)
    job = JobFactory(team=team, state="running")
    end(job)
    delivery = WebhookDelivery.objects.get()
    t0 = timezone.now()
    assert notify.deliver_webhook(delivery_id=delivery.id, now=t0) == "pending"
    assert notify.deliver_webhook(delivery_id=delivery.id, now=t0 + timedelta(seconds=5)) == "not due"
    assert notify.deliver_webhook(delivery_id=delivery.id, now=t0 + timedelta(seconds=11)) == "pending"
    delivery.refresh_from_db()
    assert delivery.next_attempt_at == t0 + timedelta(seconds=11 + 20)  # the wait doubles
    assert notify.send_due_notifications(now=t0 + timedelta(seconds=12)) == 0
    assert notify.send_due_notifications(now=t0 + timedelta(seconds=31)) == 1
    assert notify.deliver_webhook(delivery_id=delivery.id, now=t0 + timedelta(seconds=31)) == "delivered"
    assert [a.status for a in WebhookAttempt.objects.order_by("number")] == [500, 500, 200]
    ids = {h[signing.ID_HEADER] for _, h, _ in receiver.requests}
    assert len(receiver.requests) == 3 and len(ids) == 1  # one event, the same id on every try


def test_a_delivery_gives_up_after_its_attempts(team, receiver, loopback_allowed, settings):
    settings.E31_WEBHOOK_ATTEMPTS = 2
    receiver.statuses = [503]
    hook(team, receiver.url)
    end(JobFactory(team=team, state="running"))
    delivery = WebhookDelivery.objects.get()
    now = timezone.now()
    notify.deliver_webhook(delivery_id=delivery.id, now=now)
    assert notify.deliver_webhook(delivery_id=delivery.id, now=now + timedelta(hours=1)) == "failed"
    assert notify.deliver_webhook(delivery_id=delivery.id, now=now + timedelta(hours=2)) == "not due"
    assert len(receiver.requests) == 2


def test_a_name_the_resolver_cannot_answer_for_just_now_is_a_failed_try_retried_with_backoff(
    team, receiver, loopback_allowed, settings, monkeypatch
):
    settings.E31_WEBHOOK_BACKOFF_S = 10
    resolver_up, real = [False], socket.getaddrinfo

    def resolver(host, *args, **kwargs):
        if host == "hooks.example.test":
            if not resolver_up[0]:
                raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
            host = "127.0.0.1"  # where the receiver listens
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    hook(team, receiver.url.replace("127.0.0.1", "hooks.example.test"))
    end(JobFactory(team=team, state="running"))
    delivery = WebhookDelivery.objects.get()
    t0 = timezone.now()
    assert notify.deliver_webhook(delivery_id=delivery.id, now=t0) == "pending"
    assert "did not resolve (Temporary failure in name resolution)" in WebhookAttempt.objects.get().response
    resolver_up[0] = True
    assert notify.deliver_webhook(delivery_id=delivery.id, now=t0 + timedelta(seconds=11)) == "delivered"
    assert len(receiver.requests) == 1


def test_no_delivery_to_loopback_unless_allowed(team, receiver):
    with pytest.raises(addresses.Refused, match="loopback, link-local or private"):
        notify.add_webhook(team=team, user=_admin(team), url=receiver.url, secret="", now=timezone.now())
    hook(team, receiver.url)  # a row written before the rules changed is checked again before each send
    end(JobFactory(team=team, state="running"))
    delivery = WebhookDelivery.objects.get()
    assert notify.deliver_webhook(delivery_id=delivery.id, now=timezone.now()) == "failed"
    assert receiver.requests == []
    assert "private address, refused" in WebhookAttempt.objects.get().response


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:5432/",  # the database, even with loopback allowed
        "http://127.0.0.1:6379/",  # the broker
        "http://100.64.0.9/",  # the jobs' subnet
        "http://[::ffff:127.0.0.1]:5432/",  # the database behind an IPv4-mapped address
        "http://169.254.169.254/latest/meta-data/",  # cloud metadata: link-local
        "http://10.0.0.1/",
        "http://0.0.0.0:8000/",
    ],
)
def test_a_webhook_never_reaches_the_platform(team, loopback_allowed, settings, url):
    settings.DATABASES["default"].update(HOST="127.0.0.1", PORT="5432")
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:6379/4"
    with pytest.raises(addresses.Refused):
        notify.add_webhook(team=team, user=_admin(team), url=url, secret="", now=timezone.now())
    assert not Webhook.objects.exists()


def test_a_node_address_is_refused_inside_an_allowed_network(team, settings, pool):
    import ipaddress

    settings.E31_WEBHOOK_PRIVATE_NETWORKS = [ipaddress.ip_network("10.0.0.0/8")]
    pool[0].address = "10.1.2.3"
    pool[0].save()
    with pytest.raises(addresses.Refused, match="platform"):
        notify.add_webhook(
            team=team, user=_admin(team), url="http://10.1.2.3:9000/x", secret="", now=timezone.now()
        )
    hooked = notify.add_webhook(
        team=team, user=_admin(team), url="http://10.9.9.9/x", secret="", now=timezone.now()
    )
    assert len(hooked.secret) >= 32  # generated when none is given


@pytest.mark.parametrize(
    "url, why",
    [
        ("ftp://example.com/x", "only http"),
        ("file:///etc/passwd", "only http"),
        ("http://user:pw@example.com/", "no user or password"),
        ("http:///nohost", "names no host"),
        ("http://example.com:99999/", "not a URL"),
        ("http://exa mple.com/", "no spaces"),
        ("", "1 to 2000"),
        ("http://e.com/" + "a" * 2000, "1 to 2000"),
        ("http://bücher.example/", "ASCII form"),
    ],
)
def test_bad_webhook_urls_are_refused_naming_why(url, why):
    with pytest.raises(addresses.Refused, match=why):
        addresses.check_url(url)


def test_a_short_secret_is_refused(team, receiver, loopback_allowed):
    with pytest.raises(addresses.Refused, match="16 to 200"):
        notify.add_webhook(team=team, user=_admin(team), url=receiver.url, secret="short", now=timezone.now())


def test_only_a_team_admin_adds_webhooks(team, member, receiver, loopback_allowed):
    with pytest.raises(notify.NotAllowed):
        notify.add_webhook(team=team, user=member, url=receiver.url, secret="", now=timezone.now())


def test_a_redirect_is_not_followed(team, loopback_allowed):
    from tests.notifications.receiver import Receiver

    target = Receiver(statuses=[302])
    try:
        hook(team, target.url)
        end(JobFactory(team=team, state="running"))
        delivery = WebhookDelivery.objects.get()
        assert notify.deliver_webhook(delivery_id=delivery.id, now=timezone.now()) == "pending"
        assert "redirects are not followed" in WebhookAttempt.objects.get().response
    finally:
        target.stop()


def test_started_staging_failed_and_budget_warning_are_events_too(team, member, pool, roots):
    hook(team, "http://hooks.example/")
    now = timezone.now()
    staging = JobFactory(team=team, state="staging")
    transitions.transition(job_id=staging.id, source=State.STAGING, target=State.ENDED, now=now,
                           end_reason=EndReason.STAGING_FAILED, reason="no such file")  # fmt: skip
    rented = JobFactory(team=team, state="rented")
    transitions.transition(job_id=rented.id, source=State.RENTED, target=State.RUNNING, now=now)
    team.monthly_budget_gpu_hours, team.budget_enforced = 1, False
    team.save()
    from jobs import declaration

    _, out = roots
    spec = declaration.validate(
        {"name": "big", "work": {"argv": ["true"]}, "request": {"gpus": 4, "hours": 2.0},
         "output": {"uri": f"file://{out}/big", "bytes": 10}},
        limits=services.pool_limits(team=team),
    )  # fmt: skip
    big = services.submit_job(team=team, user=member, spec=spec, now=now)
    events = dict(WebhookDelivery.objects.values_list("job_id", "event"))
    assert events == {staging.id: "staging_failed", rented.id: "started", big.id: "budget_warning"}
    assert "budget" in WebhookDelivery.objects.get(job=big).payload["detail"]


def test_a_requeued_job_starts_again_as_a_new_event(team):
    hook(team, "http://hooks.example/")
    job = JobFactory(team=team, state="rented", attempt=1)
    now = timezone.now()
    transitions.transition(job_id=job.id, source=State.RENTED, target=State.RUNNING, now=now)
    job.refresh_from_db()
    transitions.transition(job_id=job.id, source=State.RUNNING, target=State.QUEUED, now=now, via="requeued",
                           reason="requeued: node lost", attempt=2)  # fmt: skip
    transitions.transition(job_id=job.id, source=State.QUEUED, target=State.RENTED, now=now)
    transitions.transition(job_id=job.id, source=State.RENTED, target=State.RUNNING, now=now)
    assert WebhookDelivery.objects.filter(event="started").count() == 2


def test_another_teams_jobs_never_reach_a_webhook(team, other_team):
    hook(team, "http://hooks.example/")
    end(JobFactory(team=other_team, state="running"))
    assert not WebhookDelivery.objects.exists()


def test_a_rolled_back_transition_owes_nothing(team):
    from django.db import transaction

    hook(team, "http://hooks.example/")
    job = JobFactory(team=team, state="running")
    with pytest.raises(RuntimeError), transaction.atomic():
        end(job)
        raise RuntimeError("the release failed")
    assert not WebhookDelivery.objects.exists()


def _admin(team):
    from accounts.models import Membership
    from tests.factories import UserFactory

    user = UserFactory(username="lead")
    Membership.objects.get_or_create(team=team, user=user, defaults={"role": "admin"})
    return user


@pytest.mark.parametrize(
    "target, reason, event",
    [
        ("running", "", "started"),
        ("released", "succeeded", "ended"),
        ("released", "node_lost", "ended"),
        ("ended", "cancelled", "ended"),
        ("ended", "staging_failed", "staging_failed"),
        ("queued", "", ""),
        ("rented", "", ""),
        ("output", "", ""),
    ],
)
def test_which_moves_a_team_hears_of(target, reason, event):
    from jobs.lifecycle import notice_for

    assert notice_for(target, reason) == event


def test_a_try_whose_name_resolves_slowly_ends_within_its_deadline(
    team, receiver, loopback_allowed, settings, monkeypatch
):
    """The deadline covered the connection and the answer, not the name's lookup: a resolver that takes its
    time (timeouts on several servers) could hold a try past its lease, and beat sent the event again meanwhile
    - the same event twice to the team's receiver."""
    settings.E31_WEBHOOK_TIMEOUT_S = 0.5
    lookup = socket.getaddrinfo

    def slow_resolver(host, *args, **kwargs):
        time.sleep(3)
        return lookup("127.0.0.1" if host == "hooks.slow.example" else host, *args, **kwargs)

    monkeypatch.setattr(addresses.socket, "getaddrinfo", slow_resolver)
    hook(team, receiver.url.replace("127.0.0.1", "hooks.slow.example"))  # an address is never looked up
    end(JobFactory(team=team, state="running"))
    delivery = WebhookDelivery.objects.get()
    began = time.monotonic()
    assert notify.deliver_webhook(delivery_id=delivery.id, now=timezone.now()) == "pending"
    assert time.monotonic() - began < 2.0
    assert receiver.requests == []
    assert "did not resolve within 0.5 s" in WebhookAttempt.objects.get().response


def test_a_nul_in_the_receivers_answer_is_recorded_written_out_and_the_tries_end(
    team, loopback_allowed, settings
):
    """A receiver answering "oops" and a NUL: PostgreSQL cannot store the NUL, so no try was recorded, the attempts
    limit never applied and the event went out again every 25 s for ever."""
    from tests.notifications.receiver import Receiver

    settings.E31_WEBHOOK_ATTEMPTS = 2
    receiver = Receiver(statuses=[500])
    receiver.answer = b"oops\x00"
    try:
        hook(team, receiver.url)
        end(JobFactory(team=team, state="running"))
        delivery = WebhookDelivery.objects.get()
        now = timezone.now()
        assert notify.deliver_webhook(delivery_id=delivery.id, now=now) == "pending"
        assert notify.deliver_webhook(delivery_id=delivery.id, now=now + timedelta(hours=1)) == "failed"
    finally:
        receiver.stop()
    assert [a.response for a in WebhookAttempt.objects.order_by("number")] == ["oops\\x00", "oops\\x00"]
