"""Webhook targets that the address rules must refuse, and tries that must end within their timeout."""

import ipaddress
import socket
import threading
import time

import pytest
from django.utils import timezone

from common import pinned, platform_services
from jobs import transitions
from jobs.lifecycle import EndReason, State
from notifications import addresses
from notifications import services as notify
from notifications.models import Webhook, WebhookAttempt, WebhookDelivery
from tests.factories import JobFactory, WebhookFactory
from tests.notifications.test_webhooks import _admin

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "url",
    [
        "http://[::ffff:0:a9fe:a9fe]/latest/meta-data/",  # 169.254.169.254 in the IPv4-translated form
        "http://[::ffff:0:7f00:1]:5432/",  # 127.0.0.1:5432, the database, in the same form
        "http://[::ffff:0:a00:1]/",  # 10.0.0.1
    ],
)
def test_an_ipv4_translated_ipv6_address_is_refused_like_the_ipv4_it_carries(team, url):
    """A team admin adds a webhook whose host is an IPv4-translated IPv6 literal (::ffff:0:a.b.c.d, the
    SIIT form inside the IETF-reserved ::/8). The rules unwrap mapped, 6to4, NAT64 and IPv4-compatible
    forms but not this one, and Python's is_global calls it global although it is_reserved: the
    webhook is accepted, though the README promises no loopback, link-local, private or reserved
    address, and a SIIT translator would hand it on to the metadata service or the database."""
    host = url.split("[")[1].split("]")[0]
    assert ipaddress.ip_address(host).is_reserved  # what the README's rule refuses
    with pytest.raises(addresses.Refused):
        notify.add_webhook(team=team, user=_admin(team), url=url, secret="", now=timezone.now())
    assert not Webhook.objects.exists()
    assert not pinned.is_public(host)


class Trickler:
    """Answers a POST with a status line, then one header line every ``gap_s`` for ``for_s`` seconds:
    each read gets a byte well within the socket timeout, so no single read ever times out."""

    def __init__(self, *, gap_s: float, for_s: float) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hooks"
        self.gap_s, self.for_s, self.requests = gap_s, for_s, 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn) -> None:
        self.requests += 1
        try:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            end = time.monotonic() + self.for_s
            while time.monotonic() < end:
                time.sleep(self.gap_s)
                conn.sendall(b"X-Slow: 1\r\n")
            conn.sendall(b"Content-Length: 2\r\n\r\nok")
        except OSError:
            pass
        finally:
            conn.close()

    def stop(self) -> None:
        self.sock.close()


@pytest.fixture
def trickler():
    receiver = Trickler(gap_s=0.25, for_s=8)
    yield receiver
    receiver.stop()


def test_a_receiver_that_trickles_its_answer_cannot_hold_a_try_past_its_timeout(
    team, settings, loopback_allowed, trickler
):
    """An attacker's receiver (or a broken proxy) answers each webhook with a header line every quarter
    second. The timeout applies to each socket read only, so the try goes on for as long as the
    receiver likes: here 8 s with E31_WEBHOOK_TIMEOUT_S = 1, past the delivery's lease (2 x 1 + 5 = 7 s),
    after which beat re-sends the same event while the first try still holds a worker (and a slow
    enough receiver ties up every notification worker). A try should end, as "no answer", within
    about its timeout."""
    settings.E31_WEBHOOK_TIMEOUT_S = 1
    WebhookFactory(team=team, url=trickler.url, secret="s3cret-s3cret-s3cret", created_at=timezone.now())
    job = JobFactory(team=team, state="running")
    transitions.transition(job_id=job.id, source=State.RUNNING, target=State.RELEASED,
                           now=timezone.now(), end_reason=EndReason.FAILED, exit_code=3)  # fmt: skip
    delivery = WebhookDelivery.objects.get()
    lease_s = settings.E31_WEBHOOK_TIMEOUT_S * 2 + 5
    began = time.monotonic()
    assert notify.deliver_webhook(delivery_id=delivery.id, now=timezone.now()) == "pending"  # retried
    took = time.monotonic() - began
    assert took < lease_s, f"one try took {took:.1f} s, past the delivery's {lease_s} s lease"
    assert took < settings.E31_WEBHOOK_TIMEOUT_S * 2.5
    assert WebhookAttempt.objects.get().response.startswith("no answer")


def _own_outbound_address() -> str:
    """The address this host sends from, found by routing, not by reading its interfaces: a UDP socket's
    connect sends nothing."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("198.51.100.1", 9))
        return probe.getsockname()[0]


def test_the_senders_own_address_is_refused_inside_a_network_an_operator_allowed(team, settings):
    """An operator allows the office network for the teams' internal receivers, and the console's host sits in
    it: a team admin's webhook to the host's own address reached every service the host listens on, firewalled
    from outside but not from itself (an admin page on 0.0.0.0, a metrics port)."""
    own = _own_outbound_address()
    settings.E31_WEBHOOK_PRIVATE_NETWORKS = [ipaddress.ip_network(f"{own}/16", strict=False)]
    with pytest.raises(addresses.Refused, match="an address of this platform"):
        notify.add_webhook(
            team=team, user=_admin(team), url=f"http://{own}:9100/", secret="", now=timezone.now()
        )


FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     |-- 10.8.0.7
        /32 host LOCAL
     +-- 10.9.0.0/24 2 0 2
        |-- 10.9.0.0
           /24 host LOCAL
     |-- 127.0.0.1
        /32 host LOCAL
"""


def test_every_local_route_of_the_host_is_its_own_an_anyip_range_too(tmp_path):
    """The kernel's routing table names each address of the host "host LOCAL": one address (/32), or a whole range
    the host answers for (AnyIP, /24), which reading the /32 entries alone let through."""
    (tmp_path / "fib_trie").write_text(FIB_TRIE)
    (tmp_path / "if_inet6").write_text("fd000000000000000000000000000002 04 40 00 82     eth0\n")
    assert platform_services.host_networks(tmp_path) == [
        ipaddress.ip_network("10.8.0.7/32"),
        ipaddress.ip_network("10.9.0.0/24"),
        ipaddress.ip_network("127.0.0.1/32"),
        ipaddress.ip_network("fd00::2/128"),
    ]
