"""Where a webhook may be sent: a public address, or a network an operator allowed; never the platform.

Checked when a webhook is added and again before every send (a name may resolve elsewhere by then),
and the connection goes to the very address that passed, so a second lookup cannot redirect it.
The platform is the database, the broker, the cache and the mail relay this console uses (every host of each), the cloud
metadata services, the jobs' subnet, the nodes' addresses, every address of the host that sends (but loopback)
and whatever E31_WEBHOOK_DENY lists: refused even inside an allowed network.
"""

import ipaddress
import logging
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from urllib.parse import urlsplit

from django.conf import settings

from common import pinned, platform_services
from jobs.models import Node

log = logging.getLogger(__name__)

MAX_URL = 2000


class Refused(Exception):
    """The URL or the address it resolves to may not receive webhooks; the message says why."""


class Unresolved(Refused):
    """The host's name did not resolve. Refused when a webhook is added, but at send time a failed try
    that is retried: a resolver may be briefly unable to answer (EAI_AGAIN), and a name briefly gone."""


def check_url(url: str) -> tuple[str, int]:
    """(host, port) of a well-formed http(s) URL without credentials; Refused otherwise."""
    if not url or len(url) > MAX_URL:
        raise Refused(f"a URL of 1 to {MAX_URL} characters")
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url) or not url.isascii():
        raise Refused("no spaces or control characters; write international names in their ASCII form")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Refused(f"not a URL: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        raise Refused("only http:// and https:// URLs")
    if not parts.hostname:
        raise Refused("the URL names no host")
    if parts.username is not None or parts.password is not None:
        raise Refused("no user or password in the URL: the signature authenticates each event")
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


# Lookups with a deadline run here: a resolver's own timeouts (several servers, several tries each) would hold a
# send past its lease, and the event would be sent again meanwhile. One given up at its deadline holds its thread
# until the resolver gives up too, so there are many (a thread waiting on a resolver costs little), and a name
# already being looked up is waited for, never looked up again: a team whose names never answer holds at most a
# thread per name (E31_WEBHOOKS_PER_TEAM), never every one that other teams' webhooks wait on.
_LOOKUPS = ThreadPoolExecutor(max_workers=32, thread_name_prefix="webhook-lookup")
_IN_FLIGHT: dict[tuple[str, int | None], Future] = {}
_IN_FLIGHT_LOCK = threading.RLock()  # a lookup done at once calls _forget in the submitting thread


def _lookup(host: str, port: int | None, deadline: float | None) -> list:
    """``getaddrinfo`` for a stream socket, given up at ``deadline`` (a ``time.monotonic()``), if any; an address
    is its own answer."""
    if literal := _address(host, port):
        return literal
    if deadline is None:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    try:
        return _shared_lookup(host, port).result(timeout=max(deadline - time.monotonic(), 0.0))
    except TimeoutError:
        raise Unresolved(
            f"{host}: the name did not resolve within {settings.E31_WEBHOOK_TIMEOUT_S:g} s"
        ) from None


def _address(host: str, port: int | None) -> list:
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return []
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (str(ip), port or 0))]


def _shared_lookup(host: str, port: int | None) -> Future:
    """The lookup of ``host`` under way, or a new one."""
    key = (host, port)
    with _IN_FLIGHT_LOCK:
        lookup = _IN_FLIGHT.get(key)
        if lookup is None:
            lookup = _LOOKUPS.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
            _IN_FLIGHT[key] = lookup
            lookup.add_done_callback(lambda _: _forget(key, lookup))
    return lookup


def _forget(key: tuple[str, int | None], lookup: Future) -> None:
    with _IN_FLIGHT_LOCK:
        if _IN_FLIGHT.get(key) is lookup:
            del _IN_FLIGHT[key]


def checked_addresses(host: str, port: int, *, deadline: float | None = None) -> list[str]:
    """Every address ``host`` has, if each one may receive a webhook on ``port``; the lookups (the platform's
    names too) given up at ``deadline``."""
    try:
        infos = _lookup(host, port, deadline)
    except socket.gaierror as exc:
        raise Unresolved(f"{host}: the name did not resolve ({exc.strerror or exc})") from exc
    except UnicodeError as exc:  # a label too long or empty: no resolver will ever take it
        raise Refused(f"{host}: not a host name") from exc
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    platform = platform_endpoints(deadline=deadline)
    for address in addresses:
        why = refusal(address, port, platform)
        if why:
            raise Refused(f"{host} resolves to {address}: {why}")
    return addresses


def refusal(address: str, port: int, platform: tuple[platform_services.Platform, list]) -> str:
    """Why ``address:port`` may not receive a webhook, or ""."""
    ip = pinned.unwrapped(address)
    services, networks = platform
    if services.refuses(address, port) or any(ip in net for net in networks if net.version == ip.version):
        return "an address of this platform, refused"
    if pinned.is_public(address):
        return ""
    allowed = settings.E31_WEBHOOK_PRIVATE_NETWORKS
    if any(ip in net for net in allowed if net.version == ip.version):
        return ""
    return "a loopback, link-local or private address, refused (an operator may allow a network)"


def platform_endpoints(*, deadline: float | None = None) -> tuple[platform_services.Platform, list]:
    """The services this console uses, and the networks of jobs, nodes, cloud metadata and the console's hosts,
    refused on every port: a host firewalled from outside is open to itself. Unresolved while a service's host
    does not resolve: its address could be the receiver's."""
    try:
        services = platform_services.resolved(
            lambda host, port: _service_addresses(host, port, deadline), skip_unresolved=False
        )
    except (
        platform_services.Unresolved
    ) as exc:  # tried again later, as a receiver's own name that did not resolve
        raise Unresolved(str(exc)) from exc
    networks = [ipaddress.ip_network(settings.E31_JOB_SUBNET), *platform_services.METADATA]
    networks += [*settings.E31_WEBHOOK_DENY, *_own_addresses(services)]
    for address in Node.objects.exclude(address="").values_list("address", flat=True):
        try:
            networks.append(ipaddress.ip_network(pinned.unwrapped(address)))
        except ValueError:
            networks += [ipaddress.ip_network(ip) for ip in _resolved(address, 0, deadline)]
    return services, networks


def _service_addresses(host: str, port: int | None, deadline: float | None) -> list[str]:
    try:
        return [info[4][0] for info in _lookup(host, port, deadline)]
    except (socket.gaierror, UnicodeError, Unresolved) as exc:
        # Which host it was is the operators' (the worker's log), not the team's.
        log.warning("the platform's host %s did not resolve: %s", host, exc)
        raise platform_services.Unresolved(
            "a host of this platform did not resolve, so the receiver's address could not be told apart from it"
        ) from exc


def _resolved(host: str, port: int, deadline: float | None) -> list:
    try:
        return [pinned.unwrapped(info[4][0]) for info in _lookup(host, port or None, deadline)]
    except (socket.gaierror, UnicodeError):
        return []


def _own_addresses(services: platform_services.Platform) -> list:
    """The sending host's own addresses, but loopback: an operator who allows a loopback network can only mean this
    host (a receiver beside the embedded console); one who allows an office network that holds the host means the
    other machines in it. (E31_CONSOLE_URL's public address is not among them: reached from here it is reached as
    from anywhere, and behind a shared load balancer or CDN it is other sites' too.) A service of the platform on
    this host stays refused through loopback too (``Platform.refuses``)."""
    return [net for net in services.host_networks if not net.is_loopback]
