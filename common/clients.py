"""Who is asking: the client's address, as the console's own proxies report it.

Behind a load balancer every request arrives from the balancer's address, so limits keyed by
``REMOTE_ADDR`` would put every client in one bucket. Each proxy appends the address it received
the request from to ``X-Forwarded-For``; entries to the left of our own proxies were written by the
client and can say anything. So the client is the rightmost hop (the peer included) that is not a
proxy listed in ``E31_TRUSTED_PROXIES``. With no list the header is ignored and the peer is the client.

An IPv4 address seen through a dual-stack socket (``::ffff:10.0.0.2``) is that IPv4 address, peer and
hops alike, so a proxy listed as ``10.0.0.2`` is recognised whichever socket gunicorn listens on. The
limits count an IPv6 client by its network (``client_network``): one home line or VM holds a whole /64,
and would get a fresh count for each of its addresses.
"""

import ipaddress
from functools import lru_cache

from django.conf import settings
from django.http import HttpRequest

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")  # IPv4 addresses as a dual-stack socket reports them


@lru_cache(maxsize=8)
def trusted_networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    """``E31_TRUSTED_PROXIES`` as networks: addresses ("10.0.0.5") or ranges ("10.0.0.0/24"); ValueError if malformed."""
    networks = (ipaddress.ip_network(entry.strip(), strict=False) for entry in entries if entry.strip())
    return tuple(_unmapped_network(network) for network in networks)


def _unmapped_network(network: Network) -> Network:
    """``::ffff:10.0.0.0/120`` is ``10.0.0.0/24``: the hops it would match are compared unmapped."""
    if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(_MAPPED):
        return ipaddress.IPv4Network((int(network.network_address) & 0xFFFFFFFF, network.prefixlen - 96))
    return network


def parse_hop(text: str) -> Address | None:
    """One hop of X-Forwarded-For as an address; a port ("1.2.3.4:80", "[::1]:80") is dropped, an IPv4-mapped
    address ("::ffff:1.2.3.4") unmapped. None if not an address."""
    text = text.strip()
    if text.startswith("["):  # [IPv6]:port
        text = text[1 : text.find("]")] if "]" in text else text
    elif text.count(":") == 1:  # IPv4:port; a bare IPv6 address has more colons
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    return getattr(address, "ipv4_mapped", None) or address


def client_network(request: HttpRequest) -> str | None:
    """The client as the limits count it: its IPv4 address, or for IPv6 the first address of its network of
    ``E31_IPV6_CLIENT_PREFIX`` bits (2001:db8:1:2::7 is 2001:db8:1:2:: at /64). Still an address, so axes
    stores it in its address field. None when the request carries no address."""
    address = _client(request)
    if isinstance(address, ipaddress.IPv6Address):
        prefix = settings.E31_IPV6_CLIENT_PREFIX
        return str(ipaddress.IPv6Network((int(address), prefix), strict=False).network_address)
    return None if address is None else str(address)


def _client(request: HttpRequest) -> Address | None:
    peer = parse_hop(request.META.get("REMOTE_ADDR") or "")
    trusted = trusted_networks(tuple(settings.E31_TRUSTED_PROXIES))
    if not trusted or peer is None:
        return peer
    header = request.META.get("HTTP_X_FORWARDED_FOR", "")
    hops = [parse_hop(hop) for hop in header.split(",") if hop.strip()] + [peer]
    nearest: Address | None = None
    for address in reversed(hops):
        if address is None:  # no proxy of ours writes this: the nearest trusted hop is all we know
            return nearest
        if not any(address in network for network in trusted):
            return address
        nearest = address
    return nearest  # every hop is one of our proxies: the request came from inside
