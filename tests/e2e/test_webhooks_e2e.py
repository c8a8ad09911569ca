"""Webhooks for real: a job runs on the pool and the control worker delivers its signed events."""

import ipaddress
import json

import pytest
from django.utils import timezone

from notifications import services as notify
from notifications import signing
from notifications.models import WebhookDelivery
from tests.e2e.conftest import wait_for, wait_for_state
from tests.e2e.test_lifecycle_e2e import py, submit
from tests.factories import MembershipFactory, TeamFactory, UserFactory
from tests.notifications.receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


@pytest.fixture
def receiver(monkeypatch, settings):
    """A receiver on a loopback address of its own, in a network allowed as an operator may allow one
    (the pool's nodes are on 127.0.0.1: that address stays refused, it is the platform); retries a second apart."""
    monkeypatch.setenv("E31_WEBHOOK_PRIVATE_NETWORKS", "127.0.0.0/8")
    monkeypatch.setenv("E31_WEBHOOK_BACKOFF_S", "1")
    settings.E31_WEBHOOK_PRIVATE_NETWORKS = [ipaddress.ip_network("127.0.0.0/8")]
    server = Receiver(statuses=[500, 200], host="127.0.0.2")
    yield server
    server.stop()


def test_a_jobs_events_reach_the_webhook_signed_and_retried_after_a_500(receiver, live_pool):
    team = TeamFactory(name="vision", slug="vision")
    lead = MembershipFactory(team=team, user=UserFactory(username="lead"), role="admin").user
    hook = notify.add_webhook(team=team, user=lead, url=receiver.url, secret="", now=timezone.now())
    job = submit(lead, py("import sys; print('bye'); sys.exit(4)"))
    wait_for_state(job.id, "released")
    wait_for(
        lambda: WebhookDelivery.objects.filter(job=job, state="delivered").count() == 2,
        timeout=60, what="both events delivered",
    )  # fmt: skip
    events = [json.loads(body) for _, _, body in receiver.requests]
    assert sorted({e["type"] for e in events}) == ["ended", "started"]
    ended = next(e for e in events if e["type"] == "ended")
    assert (ended["job"]["id"], ended["job"]["end_reason"], ended["job"]["exit_code"]) == (
        job.id,
        "failed",
        4,
    )
    for _, headers, body in receiver.requests:
        assert signing.verify(hook.secret, headers, body, now=int(timezone.now().timestamp()))
    with pytest.raises(
        notify.addresses.Refused, match="platform"
    ):  # a node's address, even in the allowed range
        notify.add_webhook(team=team, user=lead, url="http://127.0.0.1:9/", secret="", now=timezone.now())
    tries = sorted([t.status for t in d.tries.all()] for d in WebhookDelivery.objects.filter(job=job))
    assert tries == [[200], [500, 200]]  # whichever event came first met the 500 and was sent again
    assert len(events) == 3 and len({e["id"] for e in events}) == 2  # a retry carries its event's id
