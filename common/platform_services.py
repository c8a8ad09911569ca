"""Where the platform's own services listen, as its settings name them: what no tenant's traffic may reach.

A webhook never goes to them (``notifications.addresses``), a job allowed the internet is denied them
(``jobs.agent``), and an http(s) input or an outside registry may not be one of them, even where an operator
allows private sources (``jobs.transfers.sources``). All three read the same list, so a setting's second host
(a failover broker, a multi-host database, a cache's other servers) is never refused by one and missed by another.
"""

import ipaddress
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from common import pinned

log = logging.getLogger(__name__)

DEFAULT_PORTS = {
    "redis": 6379, "rediss": 6379, "sentinel": 26379, "amqp": 5672, "amqps": 5671, "pyamqp": 5672,
    "librabbitmq": 5672,
}  # fmt: skip
DATABASE_PORT = 5432
# Cloud metadata and host services answer with the host's own credentials: never a data source nor a webhook
# receiver, whatever network an operator allows (AWS and its IPv6 form, GCP and Azure share 169.254.169.254; ECS
# tasks and EKS pod identity and its IPv6 form; Azure's WireServer, a public address; Alibaba).
METADATA = tuple(
    ipaddress.ip_network(net)
    for net in (
        "169.254.169.254/32", "fd00:ec2::254/128", "169.254.170.2/32", "169.254.170.23/32", "fd00:ec2::23/128",
        "168.63.129.16/32", "100.100.100.200/32",
    )
)  # fmt: skip
UNSPECIFIED = (
    ipaddress.ip_network("0.0.0.0/8"),
    ipaddress.ip_network("::/128"),
)  # reaches this host on Linux
LOCAL_ROUTE = re.compile(r"/([0-9]{1,2}) host LOCAL")  # the kernel's routing table: an address of this host
CACHED_S = 30.0  # how long ``cached()`` keeps what the names resolved to: a check per connection is too many


class Unresolved(OSError):
    """A host of the platform did not resolve, so its addresses cannot be told apart from a tenant's."""


def locations() -> list[tuple[str, int | None]]:
    """(host, port) of every database host (libpq's multi-host form: ``h1,h2`` with one port or one each), every
    broker of kombu's failover list (``url1;url2``), every cache server (a list, or a string split on ; and , as
    Django's Redis cache splits it) and the mail server. Port None: every port (a scheme that implies none, or a
    port that is not a number). A Unix socket (a host starting with /) and a table name have none."""
    return list(dict.fromkeys([*_required(), *_best_effort()]))


def _required() -> list[tuple[str, int | None]]:
    """What every process of the platform, a node's too, must reach: a host of these that does not resolve fails
    closed."""
    return _database() + _from_urls(settings.CELERY_BROKER_URL.split(";"))


def _best_effort() -> list[tuple[str, int | None]]:
    """What the console's processes use and a node's may never resolve (the cache, the mail relay): refused where
    they resolve, skipped (logged) where they do not, or every http(s) input of the pool would wait on them."""
    cache = settings.CACHES["default"].get("LOCATION", "")
    found = _from_urls(re.split(r"[;,]", cache) if isinstance(cache, str) else cache)
    return found + ([(settings.EMAIL_HOST, settings.EMAIL_PORT)] if settings.EMAIL_HOST else [])


def _from_urls(urls) -> list[tuple[str, int | None]]:
    found = []
    for url in urls:
        if "://" not in url:
            continue
        parts = urlsplit(url.strip())
        try:
            port = parts.port or DEFAULT_PORTS.get(parts.scheme)
        except ValueError:  # not a number: the host is refused on every port
            port = None
        if parts.hostname:
            found.append((parts.hostname, port))
    return found


def hosts(*, required: bool) -> list[str]:
    """The names of the services every process must reach (``required``), or of the others."""
    return list(dict.fromkeys(host for host, _ in (_required() if required else _best_effort())))


def _database() -> list[tuple[str, int | None]]:
    db = settings.DATABASES["default"]
    names = [host.strip() for host in (db.get("HOST") or "").split(",")]
    ports = [port.strip() for port in str(db.get("PORT") or "").split(",")]
    found = []
    for n, host in enumerate(names):
        port = ports[n] if len(ports) == len(names) else ports[0]
        if host and not host.startswith("/"):
            found.append((host, int(port) if port.isdigit() else DATABASE_PORT if not port else None))
    return found


@dataclass(frozen=True)
class Platform:
    """Where the services resolved to, and this host's own addresses."""

    endpoints: frozenset[tuple[pinned.IPAddress, int | None]]
    host_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]

    @property
    def local_ports(self) -> frozenset[int | None]:
        """The ports of the services that listen on this host."""
        return frozenset(port for ip, port in self.endpoints if self.on_this_host(ip))

    def on_this_host(self, ip: pinned.IPAddress) -> bool:
        return ip.is_loopback or any(
            ip in net for net in (*UNSPECIFIED, *self.host_networks) if net.version == ip.version
        )

    def refuses(self, address: str, port: int) -> bool:
        """Whether ``address:port`` reaches a service of the platform: the address it resolved to, on its port (on
        any where the port is unknown), and a service on this host through any of this host's addresses
        (127.0.0.2, 0.0.0.0 and the host's own reach one listening on 127.0.0.1 or on all of them)."""
        ip = pinned.unwrapped(address)
        if (ip, port) in self.endpoints or (ip, None) in self.endpoints:
            return True
        local = self.local_ports
        return bool(local) and (port in local or None in local) and self.on_this_host(ip)


def resolved(
    resolve: Callable[[str, int | None], list[str]] | None = None, *, skip_unresolved: bool = True
) -> Platform:
    """The platform as its names resolve now (``resolve(host, port)``: addresses; Unresolved if it cannot).
    ``skip_unresolved``: a cache or mail relay that does not resolve is left out (a node's view), else Unresolved
    (the console's processes use them, and a lookup given up at a deadline is no proof the name is gone)."""
    resolve = resolve or _resolve
    endpoints = set()
    for host, port in _required():
        endpoints |= {(pinned.unwrapped(address), port) for address in resolve(host, port)}
    for host, port in _best_effort():
        try:
            endpoints |= {(pinned.unwrapped(address), port) for address in resolve(host, port)}
        except Unresolved:
            if not skip_unresolved:
                raise
            log.warning("the platform's host %s did not resolve here: not refused by address", host)
    return Platform(frozenset(endpoints), tuple(host_networks()))


_cache: tuple[float, Platform] | None = None
_cache_lock = threading.Lock()


def cached() -> Platform:
    """``resolved()``, kept CACHED_S: a stager checks every connection (each input, redirect and registry hop)."""
    global _cache
    with _cache_lock:
        if _cache is None or time.monotonic() - _cache[0] > CACHED_S:
            _cache = (time.monotonic(), resolved())
        return _cache[1]


@receiver(setting_changed)
def forget(**_) -> None:
    """Drops what ``cached()`` kept: at once when a setting changes (tests, a reload)."""
    global _cache
    with _cache_lock:
        _cache = None


def _resolve(host: str, port: int | None) -> list[str]:
    try:
        return [info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]
    except (OSError, UnicodeError) as exc:
        # Which host it was is the operators' (this log), not the team's that reads the refusal.
        log.warning("the platform's host %s did not resolve: %s", host, exc)
        raise Unresolved(
            "a host of this platform did not resolve, so its addresses could not be told apart"
        ) from exc


def is_metadata(address: str) -> bool:
    ip = pinned.unwrapped(address)
    return any(ip in net for net in METADATA if net.version == ip.version)


def is_unspecified(address: str) -> bool:
    ip = pinned.unwrapped(address)
    return any(ip in net for net in UNSPECIFIED if net.version == ip.version)


def host_networks(root: Path = Path("/proc/net")) -> list:
    """Every address of this host's interfaces, in its network namespace (Linux's routing table and interface
    list; elsewhere none)."""
    own = []
    try:
        last = ""
        for line in (root / "fib_trie").read_text().splitlines():
            if "|--" in line:
                last = line.split("|--")[1].strip()
            elif (
                local := LOCAL_ROUTE.fullmatch(line.strip())
            ) is not None:  # /24 host LOCAL: a whole AnyIP range
                own.append(ipaddress.ip_network(f"{last}/{local[1]}", strict=False))
        own += [
            ipaddress.ip_network(ipaddress.IPv6Address(int(line.split()[0], 16)))
            for line in (root / "if_inet6").read_text().splitlines()
            if line.strip()
        ]
    except (OSError, ValueError, IndexError):
        return own
    return list(dict.fromkeys(own))
