"""The client's address: the rightmost X-Forwarded-For hop that is not one of our proxies; and what the
limits keyed by it allow (an IPv6 client counts by its network)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import RequestFactory
from django.urls import reverse

from common import clients
from tests.conftest import PASSWORD
from tests.factories import UserFactory

LB = "10.0.0.2"  # the load balancer the console sits behind
LOGIN = reverse("accounts:login")
ATTACKER, OPERATOR_HOME = "203.0.113.7", "198.51.100.9"


def _request(peer: str, forwarded: str | None = None):
    headers = {"REMOTE_ADDR": peer}
    if forwarded is not None:
        headers["HTTP_X_FORWARDED_FOR"] = forwarded
    return RequestFactory().get("/", **headers)


def test_without_trusted_proxies_the_header_is_ignored_and_the_peer_is_the_client(settings):
    settings.E31_TRUSTED_PROXIES = []
    assert clients.client_network(_request(LB, "198.51.100.9")) == LB


@pytest.mark.parametrize(
    ("forwarded", "client"),
    [
        ("198.51.100.9", "198.51.100.9"),  # one proxy: it appended the client
        ("203.0.113.66, 198.51.100.9", "198.51.100.9"),  # the client's own claim on the left is ignored
        ("198.51.100.9, 10.0.0.7", "198.51.100.9"),  # two proxies of ours, both skipped
        ("198.51.100.9:51234", "198.51.100.9"),  # a proxy that writes the port too
        ("[2001:db8::5]:443", "2001:db8::5"),
        ("2001:db8::5", "2001:db8::5"),
        (
            "not-an-address, 10.0.0.7",
            "10.0.0.7",
        ),  # garbage a proxy passed on: the nearest proxy is all we know
        ("", LB),  # the balancer's own probe
    ],
)
def test_behind_trusted_proxies_the_rightmost_hop_that_is_not_ours_is_the_client(settings, forwarded, client):
    settings.E31_TRUSTED_PROXIES = [LB, "10.0.0.0/29"]
    settings.E31_IPV6_CLIENT_PREFIX = 128  # an IPv6 client as its whole address
    assert clients.client_network(_request(LB, forwarded)) == client


def test_a_client_that_reaches_the_console_directly_cannot_claim_another_address(settings):
    settings.E31_TRUSTED_PROXIES = [LB]
    assert clients.client_network(_request("192.0.2.50", "198.51.100.9")) == "192.0.2.50"


def test_a_request_without_any_address_has_none(settings):
    settings.E31_TRUSTED_PROXIES = []
    assert clients.client_network(_request("")) is None


@pytest.fixture
def fast_hasher(settings):
    settings.E31_LOGIN_FAILURE_LIMIT = 10
    settings.E31_LOGIN_WINDOW_S = 900
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def test_a_trusted_proxy_seen_through_a_dual_stack_socket_is_still_trusted(settings):
    """gunicorn bound to [::] (dual stack) reports an IPv4 balancer as ::ffff:10.0.0.2. The operator lists
    the balancer as 10.0.0.2; were the mapped peer not matched against it, the balancer itself would be
    taken for the client and every client would share its address."""
    settings.E31_TRUSTED_PROXIES = [LB]
    request = RequestFactory().get("/", REMOTE_ADDR=f"::ffff:{LB}", HTTP_X_FORWARDED_FOR=OPERATOR_HOME)
    assert clients.client_network(request) == OPERATOR_HOME


@pytest.mark.parametrize("peer", [LB, f"::ffff:{LB}"])
def test_a_proxy_listed_in_its_dual_stack_form_is_trusted_whichever_way_it_connects(settings, peer):
    settings.E31_TRUSTED_PROXIES = [f"::ffff:{LB}"]
    assert clients.client_network(_request(peer, f"::ffff:{OPERATOR_HOME}")) == OPERATOR_HOME


@pytest.mark.parametrize(
    ("peer", "prefix", "counted_as"),
    [
        ("2001:db8:1:2:a:b:c:d", 64, "2001:db8:1:2::"),
        ("2001:db8:1:2:a:b:c:d", 48, "2001:db8:1::"),
        ("2001:db8:1:2:a:b:c:d", 128, "2001:db8:1:2:a:b:c:d"),
        ("198.51.100.9", 64, "198.51.100.9"),  # an IPv4 client is its address
        ("::ffff:198.51.100.9", 64, "198.51.100.9"),
        ("", 64, None),
    ],
)
def test_the_limits_count_an_ipv6_client_by_its_network(settings, peer, prefix, counted_as):
    settings.E31_TRUSTED_PROXIES = []
    settings.E31_IPV6_CLIENT_PREFIX = prefix
    assert clients.client_network(_request(peer)) == counted_as


def test_a_prefix_length_that_is_no_network_is_refused_at_start():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "e31web.settings", "E31_IPV6_CLIENT_PREFIX": "129"}
    started = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert started.returncode != 0 and "ImproperlyConfigured: E31_IPV6_CLIENT_PREFIX" in started.stderr


@pytest.mark.django_db
def test_behind_a_dual_stack_listener_an_attacker_cannot_lock_the_operator_out_from_elsewhere(
    client, settings, fast_hasher
):
    """Same deployment: ten wrong passwords for 'olga' from the attacker's address do not lock olga out at
    home (they would, were every client taken for the balancer)."""
    UserFactory(username="olga", is_staff=True)
    settings.E31_TRUSTED_PROXIES = [LB]

    def sign_in(password: str, client_addr: str):
        return client.post(LOGIN, {"username": "olga", "password": password},
                           REMOTE_ADDR=f"::ffff:{LB}", HTTP_X_FORWARDED_FOR=client_addr)  # fmt: skip

    for _ in range(10):
        sign_in("wrong", ATTACKER)
    assert sign_in(PASSWORD, OPERATOR_HOME).status_code == 302


@pytest.mark.django_db
def test_one_ipv6_subnet_does_not_get_ten_guesses_per_address(client, settings, fast_hasher):
    """An attacker with one IPv6 /64 (what any home line or VM is given) rotates the last bits of the source
    address: were each address counted alone, each of its 2**64 addresses would get ten guesses at the
    operator's password and the lockout would never engage."""
    UserFactory(username="olga", is_staff=True)
    settings.E31_TRUSTED_PROXIES = []
    answered = 0
    for n in range(1, 31):  # 30 guesses from 2001:db8:1:2::1 .. ::1e
        response = client.post(LOGIN, {"username": "olga", "password": f"guess{n}"},
                               REMOTE_ADDR=f"2001:db8:1:2::{n:x}")  # fmt: skip
        answered += response.status_code == 200
    assert answered <= 10, f"{answered} guesses answered from one /64 (limit 10)"


@pytest.mark.django_db
def test_one_ipv6_subnet_does_not_get_five_public_posts_per_address(client, settings):
    settings.E31_TRUSTED_PROXIES = []
    settings.E31_PUBLIC_FORM_LIMIT = 5
    statuses = [
        client.post(
            reverse("partners"),
            {"form": "waitlist", "email": f"x{n}@example.org"},
            REMOTE_ADDR=f"2001:db8:1:2::{n:x}",
        ).status_code
        for n in range(1, 9)
    ]
    assert 429 in statuses, f"eight posts from one /64 all accepted: {statuses}"
