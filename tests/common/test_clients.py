"""The client's address: the rightmost X-Forwarded-For hop that is not one of our proxies."""

import pytest
from django.test import RequestFactory

from common.clients import client_address

LB = "10.0.0.2"  # the load balancer the console sits behind


def _request(peer: str, forwarded: str | None = None):
    headers = {"REMOTE_ADDR": peer}
    if forwarded is not None:
        headers["HTTP_X_FORWARDED_FOR"] = forwarded
    return RequestFactory().get("/", **headers)


def test_without_trusted_proxies_the_header_is_ignored_and_the_peer_is_the_client(settings):
    settings.E31_TRUSTED_PROXIES = []
    assert client_address(_request(LB, "198.51.100.9")) == LB


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
    assert client_address(_request(LB, forwarded)) == client


def test_a_client_that_reaches_the_console_directly_cannot_claim_another_address(settings):
    settings.E31_TRUSTED_PROXIES = [LB]
    assert client_address(_request("192.0.2.50", "198.51.100.9")) == "192.0.2.50"


def test_a_request_without_any_address_has_none(settings):
    settings.E31_TRUSTED_PROXIES = []
    assert client_address(_request("")) is None
