"""One team's unanswered names cannot take the name lookups every other team's webhooks wait on."""

import socket
import threading
import time

import pytest
from django.utils import timezone

from notifications import addresses
from notifications import services as notify
from notifications.models import WebhookDelivery
from tests.factories import JobFactory, WebhookFactory
from tests.notifications.test_webhooks import end

pytestmark = pytest.mark.django_db


@pytest.fixture
def black_hole(monkeypatch):
    """A resolver whose *.black-hole.example names never answer (held until the test ends); others resolve."""
    real, released, asked = socket.getaddrinfo, threading.Event(), []

    def resolver(host, *args, **kwargs):
        asked.append(host)
        if host.endswith(".black-hole.example"):
            released.wait(30)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real("127.0.0.1" if host == "hooks.victim.example" else host, *args, **kwargs)

    monkeypatch.setattr(addresses.socket, "getaddrinfo", resolver)
    yield asked
    released.set()


def test_a_teams_silent_names_leave_another_teams_delivery_its_lookup(
    black_hole, other_team, receiver, loopback_allowed, settings
):
    """All lookups shared 4 threads, and one given up at its deadline kept its thread: a team admin's webhooks
    to names whose server never answers took all four, and another team's name, which resolves at once, failed
    "did not resolve within 1 s" until its delivery was given up."""
    settings.E31_WEBHOOK_TIMEOUT_S = 1.0
    for n in range(settings.E31_WEBHOOKS_PER_TEAM):  # every webhook one team may have, tried twice each
        for _ in range(2):
            with pytest.raises(addresses.Unresolved):
                addresses.checked_addresses(f"h{n}.black-hole.example", 80, deadline=time.monotonic() + 0.05)
    WebhookFactory(team=other_team, url=receiver.url.replace("127.0.0.1", "hooks.victim.example"))
    end(JobFactory(team=other_team, state="running"))
    assert (
        notify.deliver_webhook(delivery_id=WebhookDelivery.objects.get().id, now=timezone.now())
        == "delivered"
    )
    assert len(receiver.requests) == 1
    assert sum(host == "h0.black-hole.example" for host in black_hole) == 1  # the second try joined the first


def test_an_address_is_not_looked_up(black_hole):
    assert addresses.checked_addresses("93.184.215.14", 443, deadline=time.monotonic() + 1) == [
        "93.184.215.14"
    ]
    assert "93.184.215.14" not in black_hole
