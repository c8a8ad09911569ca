"""Who is asking: the client's address, as the console's own proxies report it.

Behind a load balancer every request arrives from the balancer's address, so limits keyed by
``REMOTE_ADDR`` would put every client in one bucket. Each proxy appends the address it received
the request from to ``X-Forwarded-For``; entries to the left of our own proxies were written by the
client and can say anything. So the client is the rightmost hop (the peer included) that is not a
proxy listed in ``E31_TRUSTED_PROXIES``. With no list the header is ignored and the peer is the client.
"""

import ipaddress
from functools import lru_cache

from django.conf import settings
from django.http import HttpRequest

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=8)
def trusted_networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    """``E31_TRUSTED_PROXIES`` as networks: addresses ("10.0.0.5") or ranges ("10.0.0.0/24"); ValueError if malformed."""
    return tuple(ipaddress.ip_network(entry.strip(), strict=False) for entry in entries if entry.strip())


def parse_hop(text: str) -> Address | None:
    """One hop of X-Forwarded-For as an address; a port ("1.2.3.4:80", "[::1]:80") is dropped. None if not an address."""
    text = text.strip()
    if text.startswith("["):  # [IPv6]:port
        text = text[1 : text.find("]")] if "]" in text else text
    elif text.count(":") == 1:  # IPv4:port; a bare IPv6 address has more colons
        text = text.split(":", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def client_address(request: HttpRequest) -> str | None:
    """The client's address as text, or None when the request carries none (a Unix-socket peer)."""
    peer = request.META.get("REMOTE_ADDR") or ""
    trusted = trusted_networks(tuple(settings.E31_TRUSTED_PROXIES))
    if not trusted:
        return str(parse_hop(peer) or "") or None
    header = request.META.get("HTTP_X_FORWARDED_FOR", "")
    hops = [hop for hop in header.split(",") if hop.strip()] + [peer]
    nearest: str | None = None
    for hop in reversed(hops):
        address = parse_hop(hop)
        if address is None:  # no proxy of ours writes this: the nearest trusted hop is all we know
            return nearest
        if not any(address in network for network in trusted):
            return str(address)
        nearest = str(address)
    return nearest  # every hop is one of our proxies: the request came from inside
