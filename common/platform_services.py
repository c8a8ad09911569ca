"""Where the platform's own services listen, as its settings name them: what no tenant's traffic may reach.

A webhook never goes to them (``notifications.addresses``), a job allowed the internet is denied them
(``jobs.agent``), and an http(s) input or an outside registry may not be one of them, even where an operator
allows private sources (``jobs.transfers.sources``). All three read the same list, so a setting's second host
(a failover broker, a multi-host database, a cache's other servers) is never refused by one and missed by another.
"""

import ipaddress
import re
import socket
from urllib.parse import urlsplit

from django.conf import settings

from common import pinned

DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "amqp": 5672, "amqps": 5671, "postgres": 5432}
DATABASE_PORT = 5432
# Cloud metadata services answer with the host's own credentials: never a data source nor a webhook receiver,
# whatever network an operator allows (AWS, ECS tasks, AWS over IPv6, Alibaba; GCP and Azure share the first).
METADATA = tuple(
    ipaddress.ip_network(net)
    for net in ("169.254.169.254/32", "169.254.170.2/32", "fd00:ec2::254/128", "100.100.100.200/32")
)


class Unresolved(OSError):
    """A host of the platform did not resolve, so its addresses cannot be told apart from a tenant's."""


def locations() -> list[tuple[str, int]]:
    """(host, port) of every database host (libpq's multi-host form: ``h1,h2`` with one port or one each), every
    broker of kombu's failover list (``url1;url2``) and every cache server (a list, or a string split on ; and ,
    as Django's Redis cache splits it). A Unix socket (a host starting with /) and a table name have none."""
    found = _database()
    cache = settings.CACHES["default"].get("LOCATION", "")
    urls = [
        *settings.CELERY_BROKER_URL.split(";"),
        *(re.split(r"[;,]", cache) if isinstance(cache, str) else cache),
    ]
    for url in urls:
        if "://" not in url:
            continue
        parts = urlsplit(url.strip())
        try:
            port = parts.port or DEFAULT_PORTS.get(parts.scheme)
        except ValueError:  # a port that is not a number: the service cannot use it either
            continue
        if parts.hostname and port:
            found.append((parts.hostname, port))
    return list(dict.fromkeys(found))


def _database() -> list[tuple[str, int]]:
    db = settings.DATABASES["default"]
    hosts = [host.strip() for host in (db.get("HOST") or "").split(",")]
    ports = [port.strip() for port in str(db.get("PORT") or "").split(",")]
    found = []
    for n, host in enumerate(hosts):
        port = ports[n] if len(ports) == len(hosts) else ports[0]
        if host and not host.startswith("/"):
            found.append((host, int(port) if port.isdigit() else DATABASE_PORT))
    return found


def endpoints() -> set[tuple[pinned.IPAddress, int]]:
    """(address, port) of every location, as judged (IPv4 inside IPv6 unwrapped). Unresolved if a host does not
    resolve: callers fail closed."""
    found = set()
    for host, port in locations():
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise Unresolved(f"the platform's host {host} did not resolve") from exc
        found |= {(pinned.unwrapped(info[4][0]), port) for info in infos}
    return found


def is_metadata(address: str) -> bool:
    ip = pinned.unwrapped(address)
    return any(ip in net for net in METADATA if net.version == ip.version)
