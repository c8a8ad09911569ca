"""HTTP(S) to an address already vetted: what the stager's http(s) sources and webhook delivery share.

The caller resolves the name once, judges every address it got (``is_public``, or its own rules)
and connects only to those, so a second DNS answer (rebinding) cannot send the request elsewhere,
such as a private address inside the platform. The connection still names the host: TLS verifies
the certificate for it (SNI) and the Host header is the URL's. Standard library only, so the node's
stager and the console use the same code.
"""

import http.client
import ipaddress
import socket
import ssl
from urllib.parse import SplitResult

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# A NAT64 gateway (usual on IPv6-only networks) hands 64:ff9b::/96 on to the IPv4 address in its last
# 32 bits, and a host may still route the deprecated IPv4-compatible ::a.b.c.d the same way: both are
# judged as that IPv4 address, or 64:ff9b::a9fe:a9fe would reach 169.254.169.254.
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
# Python calls these global, yet neither reaches the internet: the local-use NAT64 prefix (RFC 8215),
# whose gateway may translate into any private IPv4 range, and the deprecated site-local fec0::/10.
NOT_PUBLIC = (ipaddress.IPv6Network("64:ff9b:1::/48"), ipaddress.IPv6Network("fec0::/10"))


def unwrapped(address: str) -> IPAddress:
    """The address as judged: IPv4 inside IPv6 (mapped, 6to4, NAT64, IPv4-compatible) is the IPv4 it
    carries; a zone id is dropped."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        ip = ip.ipv4_mapped or ip.sixtofour or _carried_ipv4(ip) or ip
    return ip


def _carried_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    # :: and ::1 stay IPv6 (unspecified, loopback): an operator's "::1/128" still names loopback.
    if ip in NAT64 or (ip in IPV4_COMPATIBLE and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)
    return None


def is_public(address: str) -> bool:
    """Globally routable unicast; IPv4 inside IPv6 (mapped, 6to4, NAT64, IPv4-compatible) is judged as
    the IPv4 it carries."""
    ip = unwrapped(address)
    return ip.is_global and not ip.is_multicast and not any(ip in net for net in NOT_PUBLIC)


def connection(
    parts: SplitResult,
    port: int,
    *,
    addresses: list[str],
    timeout: float,
    response_class: type[http.client.HTTPResponse] = http.client.HTTPResponse,
) -> tuple[http.client.HTTPConnection, str]:
    """(a connection to ``parts``' host pinned to ``addresses``, the request target: path and query)."""
    cls = PinnedHTTPSConnection if parts.scheme == "https" else PinnedHTTPConnection
    conn = cls(parts.hostname, port, addresses=addresses, timeout=timeout)
    conn.response_class = response_class
    return conn, (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


class PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects only to the checked addresses; the Host header still names the host."""

    def __init__(self, host: str, port: int, *, addresses: list[str], timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._addresses = addresses

    def connect(self) -> None:
        self.sock = connect_any(self._addresses, self.port, self.timeout)


class PinnedHTTPSConnection(http.client.HTTPSConnection):
    """The same over verified TLS: the certificate must be the host name's, whatever address answered."""

    def __init__(self, host: str, port: int, *, addresses: list[str], timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._addresses = addresses

    def connect(self) -> None:
        sock = connect_any(self._addresses, self.port, self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def connect_any(addresses: list[str], port: int, timeout: float) -> socket.socket:
    """The first of the checked addresses that answers, in the resolver's order."""
    error: OSError | None = None
    for address in addresses:
        try:
            return socket.create_connection((address, port), timeout)
        except OSError as exc:
            error = exc
    raise error or OSError("no address to connect to")
