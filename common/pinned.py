"""HTTP(S) to an address already vetted: what the stager's http(s) sources and webhook delivery share.

The caller resolves the name once, judges every address it got (``is_public``, or its own rules)
and connects only to those, so a second DNS answer (rebinding) cannot send the request elsewhere,
such as a private address inside the platform. The connection still names the host: TLS verifies
the certificate for it (SNI) and the Host header is the URL's. Standard library only, so the node's
stager and the console use the same code.
"""

import http.client
import io
import ipaddress
import socket
import ssl
import time
from urllib.parse import SplitResult

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# A NAT64 gateway (usual on IPv6-only networks) hands 64:ff9b::/96 on to the IPv4 address in its last
# 32 bits, a SIIT translator does the same with the IPv4-translated ::ffff:0:a.b.c.d (RFC 2765), and a
# host may still route the deprecated IPv4-compatible ::a.b.c.d the same way: all are judged as that
# IPv4 address, or 64:ff9b::a9fe:a9fe would reach 169.254.169.254.
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
IPV4_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
# Python calls these global, yet neither reaches the internet: the local-use NAT64 prefix (RFC 8215),
# whose gateway may translate into any private IPv4 range, and the deprecated site-local fec0::/10.
NOT_PUBLIC = (ipaddress.IPv6Network("64:ff9b:1::/48"), ipaddress.IPv6Network("fec0::/10"))


def unwrapped(address: str) -> IPAddress:
    """The address as judged: IPv4 inside IPv6 (mapped, translated, 6to4, NAT64, IPv4-compatible) is the
    IPv4 it carries; a zone id is dropped."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        ip = ip.ipv4_mapped or ip.sixtofour or _carried_ipv4(ip) or ip
    return ip


def _carried_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    # :: and ::1 stay IPv6 (unspecified, loopback): an operator's "::1/128" still names loopback.
    if ip in NAT64 or ip in IPV4_TRANSLATED or (ip in IPV4_COMPATIBLE and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)
    return None


def is_public(address: str) -> bool:
    """Globally routable unicast; IPv4 inside IPv6 (mapped, translated, 6to4, NAT64, IPv4-compatible)
    is judged as the IPv4 it carries."""
    ip = unwrapped(address)
    # is_global alone lets through reserved space that Python's table misses (such as the rest of ::/8).
    return (
        ip.is_global
        and not ip.is_reserved
        and not ip.is_multicast
        and not any(ip in net for net in NOT_PUBLIC)
    )


def connection(
    parts: SplitResult,
    port: int,
    *,
    addresses: list[str],
    timeout: float,
    deadline: float | None = None,
    response_class: type[http.client.HTTPResponse] = http.client.HTTPResponse,
) -> tuple[http.client.HTTPConnection, str]:
    """(a connection to ``parts``' host pinned to ``addresses``, the request target: path and query).

    ``timeout`` bounds each socket operation; ``deadline`` (a ``time.monotonic()`` value), when given,
    bounds the whole exchange (connect, TLS, request, answer), however the other end paces its bytes.
    """
    cls = PinnedHTTPSConnection if parts.scheme == "https" else PinnedHTTPConnection
    conn = cls(parts.hostname, port, addresses=addresses, timeout=timeout, deadline=deadline)
    conn.response_class = (
        response_class if deadline is None else _by_deadline(response_class, deadline, timeout)
    )
    return conn, (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def time_left(deadline: float | None, timeout: float) -> float:
    """The timeout for the next socket operation: ``timeout``, or less if ``deadline`` comes first."""
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline passed")
    return min(timeout, left)


class PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects only to the checked addresses; the Host header still names the host."""

    def __init__(
        self, host: str, port: int, *, addresses: list[str], timeout: float, deadline: float | None = None
    ) -> None:
        super().__init__(host, port, timeout=timeout)
        self._addresses, self._deadline = addresses, deadline

    def connect(self) -> None:
        self.sock = connect_any(self._addresses, self.port, self.timeout, self._deadline)


class PinnedHTTPSConnection(http.client.HTTPSConnection):
    """The same over verified TLS: the certificate must be the host name's, whatever address answered."""

    def __init__(
        self, host: str, port: int, *, addresses: list[str], timeout: float, deadline: float | None = None
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._addresses, self._deadline = addresses, deadline

    def connect(self) -> None:
        sock = connect_any(self._addresses, self.port, self.timeout, self._deadline)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def connect_any(
    addresses: list[str], port: int, timeout: float, deadline: float | None = None
) -> socket.socket:
    """The first of the checked addresses that answers, in the resolver's order."""
    error: OSError | None = None
    for address in addresses:
        try:
            sock = socket.create_connection((address, port), time_left(deadline, timeout))
        except OSError as exc:
            error = exc
            continue
        try:  # the TLS handshake (whose timeout is its total) and the request get only the time left
            sock.settimeout(time_left(deadline, timeout))
        except TimeoutError:
            sock.close()
            raise
        return sock
    raise error or OSError("no address to connect to")


def _by_deadline(response_class: type[http.client.HTTPResponse], deadline: float, timeout: float):
    """``response_class``, reading through a socket whose every read waits only for the time left."""

    def make(sock: socket.socket, *args, **kwargs) -> http.client.HTTPResponse:
        response = response_class(sock, *args, **kwargs)
        response.fp.close()  # nothing read yet: the socket stays open for the reader below
        response.fp = io.BufferedReader(_DeadlineReader(sock, deadline, timeout))
        return response

    return make


class _DeadlineReader(io.RawIOBase):
    """A socket's reads, each one's timeout the time left before ``deadline``: a per-read timeout alone
    lets a receiver that sends a byte now and then hold the exchange for as long as it likes."""

    def __init__(self, sock: socket.socket, deadline: float, timeout: float) -> None:
        super().__init__()
        self._sock, self._raw = sock, sock.makefile("rb", buffering=0)
        self._deadline, self._timeout = deadline, timeout

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int | None:
        self._sock.settimeout(time_left(self._deadline, self._timeout))
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()
