"""The platform's services, each of them, are no tenant's webhook receiver or data source.

Reproductions (a review, with E31_WEBHOOK_PRIVATE_NETWORKS or E31_ALLOW_PRIVATE_SOURCES set by an operator for an
office network or an internal data server):
- a webhook to the second broker of a failover list, or to either host of a multi-host database setting, was
  sent (only the first broker was refused; "h1,h2" was looked up as one name and nothing of it was refused);
- an http(s) input naming the cloud metadata service (169.254.169.254) or the database was read as the job's data.
"""

import ipaddress
import time

import pytest

from common import platform_services
from jobs import transfers
from jobs.transfers import sources
from notifications import addresses

pytestmark = pytest.mark.django_db


@pytest.fixture
def failover_platform(settings):
    """A broker with a standby, a database on two hosts, a cache on two servers."""
    settings.CELERY_BROKER_URL = "redis://10.9.9.1:6379/0;redis://:pw@10.9.9.2:6380/0"
    db = {**settings.DATABASES["default"], "HOST": "10.9.9.3,10.9.9.4", "PORT": "5432,5433"}
    settings.DATABASES = {**settings.DATABASES, "default": db}  # a copy: the test database keeps its own
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": ["redis://10.9.9.5:6379/1", "redis://10.9.9.6:6379/1"]}}  # fmt: skip
    settings.EMAIL_HOST, settings.EMAIL_PORT = "10.9.9.7", 587


EVERY_SERVICE = [
    ("10.9.9.1", 6379), ("10.9.9.2", 6380), ("10.9.9.3", 5432), ("10.9.9.4", 5433), ("10.9.9.5", 6379),
    ("10.9.9.6", 6379), ("10.9.9.7", 587),
]  # fmt: skip


def test_every_service_of_the_settings_is_located(failover_platform):
    assert sorted(platform_services.locations()) == sorted(EVERY_SERVICE)


def test_one_database_port_serves_every_database_host(settings):
    settings.DATABASES = {
        **settings.DATABASES,
        "default": {**settings.DATABASES["default"], "HOST": "a,b", "PORT": ""},
    }
    settings.CELERY_BROKER_URL = "filesystem://"
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "cache"}
    }
    settings.EMAIL_HOST = ""
    assert platform_services.locations() == [("a", 5432), ("b", 5432)]


@pytest.mark.parametrize(("address", "port"), EVERY_SERVICE)
def test_no_webhook_reaches_any_of_them_inside_an_allowed_network(failover_platform, settings, address, port):
    settings.E31_WEBHOOK_PRIVATE_NETWORKS = [ipaddress.ip_network("10.0.0.0/8")]
    with pytest.raises(addresses.Refused, match="platform"):
        addresses.checked_addresses(address, port)
    assert addresses.checked_addresses("10.9.9.9", port) == ["10.9.9.9"]  # the office network stays allowed


def test_a_platform_host_that_does_not_resolve_refuses_until_it_does(settings):
    """Its address cannot be told apart from the receiver's: the send is tried again later, as for a name of the
    receiver's own that did not resolve; the team is not told the platform's host names."""
    settings.E31_WEBHOOK_PRIVATE_NETWORKS = [ipaddress.ip_network("10.0.0.0/8")]
    settings.CELERY_BROKER_URL = "redis://broker.invalid:6379/0"
    with pytest.raises(addresses.Unresolved, match="platform") as refused:
        addresses.checked_addresses("10.9.9.9", 6379)
    assert "broker.invalid" not in str(refused.value)
    settings.CELERY_BROKER_URL = "redis://10.9.9.1:6379/0"  # resolves again
    assert addresses.checked_addresses("10.9.9.9", 6379) == ["10.9.9.9"]


def test_a_source_waits_while_a_platform_host_does_not_resolve_and_is_not_told_its_name(settings):
    settings.CELERY_BROKER_URL = "redis://broker.invalid:6379/0"
    with pytest.raises(transfers.Transient, match="platform") as waited:
        sources.checked_addresses("10.9.9.9", 80, allow_private=True)
    assert "broker.invalid" not in str(waited.value)


@pytest.mark.parametrize(
    ("url", "port"),
    [
        ("pyamqp://guest@10.9.9.8//", 5672),
        ("sentinel://10.9.9.8", 26379),
        ("redis://10.9.9.8:notaport/0", 1234),
    ],
)
def test_a_broker_of_any_scheme_is_refused_and_one_whose_port_is_no_number_on_every_port(settings, url, port):
    """Celery's own pyamqp:// and sentinel:// implied no port here, and a port that is not a number was dropped:
    the broker was left out of the list, reachable by a webhook, a source and a job allowed the internet."""
    settings.CELERY_BROKER_URL = url
    settings.E31_WEBHOOK_PRIVATE_NETWORKS = [ipaddress.ip_network("10.0.0.0/8")]
    with pytest.raises(transfers.TransferFailed, match="platform"):
        sources.checked_addresses("10.9.9.8", port, allow_private=True)
    with pytest.raises(addresses.Refused, match="platform"):
        addresses.checked_addresses("10.9.9.8", port)
    assert "10.9.9.8" in platform_services.hosts(required=True)


@pytest.mark.parametrize("address", ["0.0.0.0", "0.1.2.3", "::"])
@pytest.mark.parametrize("allow_private", [False, True])
def test_no_source_is_this_hosts_unspecified_address(address, allow_private):
    """Reproduction: with private sources allowed, http://0.0.0.0:PORT/ read a service listening on this host's
    loopback, the platform's broker among them (Linux connects 0.0.0.0 to the host itself)."""
    with pytest.raises(transfers.TransferFailed, match="this host's own"):
        sources.checked_addresses(address, 6379, allow_private=allow_private)


def test_a_service_on_this_host_is_refused_through_every_loopback_address(settings):
    """127.0.0.2 reaches a service listening on 127.0.0.1 (or on all of this host's addresses): refused on that
    service's port, whichever of this host's addresses names it."""
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:16379/0"
    settings.E31_WEBHOOK_PRIVATE_NETWORKS = [ipaddress.ip_network("127.0.0.0/8")]
    for address in ("127.0.0.1", "127.0.0.2", "127.8.9.10"):
        with pytest.raises(transfers.TransferFailed, match="platform"):
            sources.checked_addresses(address, 16379, allow_private=True)
        with pytest.raises(addresses.Refused, match="platform"):
            addresses.checked_addresses(address, 16379)
    assert sources.checked_addresses("127.0.0.2", 8080, allow_private=True) == ["127.0.0.2"]  # another port


@pytest.mark.parametrize(
    "address",
    [
        "169.254.169.254",
        "169.254.170.2",
        "fd00:ec2::254",
        "100.100.100.200",
        "64:ff9b::a9fe:a9fe",
        "::ffff:169.254.169.254",
    ],
)
@pytest.mark.parametrize("allow_private", [False, True])
def test_no_source_is_a_cloud_metadata_service_even_with_private_sources_allowed(address, allow_private):
    with pytest.raises(transfers.TransferFailed, match="metadata"):
        sources.checked_addresses(address, 80, allow_private=allow_private)


@pytest.mark.parametrize(("address", "port"), EVERY_SERVICE)
def test_no_source_is_a_platform_service_even_with_private_sources_allowed(failover_platform, address, port):
    with pytest.raises(transfers.TransferFailed, match="platform"):
        sources.checked_addresses(address, port, allow_private=True)
    assert sources.checked_addresses("10.9.9.9", port, allow_private=True) == ["10.9.9.9"]


def test_a_cache_or_mail_relay_that_does_not_resolve_here_holds_no_input_back(settings):
    """A node may never resolve the console's cache or mail relay: every http(s) input of the pool waited on them."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": "redis://cache.invalid:6379/1"}}  # fmt: skip
    settings.EMAIL_HOST = "mail.invalid"
    assert sources.checked_addresses("10.9.9.9", 80, allow_private=True) == ["10.9.9.9"]


def test_a_webhook_waits_while_the_cache_or_mail_relay_does_not_resolve_in_time(settings):
    """A review: a team's own slow DNS answered just before the deadline, the platform's lookups of the cache and
    the mail relay then had no time left, and were skipped as "not resolvable here": a webhook to the cache's
    port on an allowed loopback network was sent. The console's processes use both: the send waits."""
    settings.E31_WEBHOOK_PRIVATE_NETWORKS = [ipaddress.ip_network("127.0.0.0/8")]
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": "redis://localhost:6390/1"}}  # fmt: skip
    with pytest.raises(addresses.Unresolved, match="platform"):
        addresses.checked_addresses("127.0.0.1", 6390, deadline=time.monotonic())
    with pytest.raises(addresses.Refused, match="platform"):
        addresses.checked_addresses("127.0.0.1", 6390)
