"""The platform's services, each of them, are no tenant's webhook receiver or data source.

Reproductions (a review, with E31_WEBHOOK_PRIVATE_NETWORKS or E31_ALLOW_PRIVATE_SOURCES set by an operator for an
office network or an internal data server):
- a webhook to the second broker of a failover list, or to either host of a multi-host database setting, was
  sent (only the first broker was refused; "h1,h2" was looked up as one name and nothing of it was refused);
- an http(s) input naming the cloud metadata service (169.254.169.254) or the database was read as the job's data.
"""

import ipaddress

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


EVERY_SERVICE = [
    ("10.9.9.1", 6379), ("10.9.9.2", 6380), ("10.9.9.3", 5432), ("10.9.9.4", 5433), ("10.9.9.5", 6379),
    ("10.9.9.6", 6379),
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
    assert platform_services.locations() == [("a", 5432), ("b", 5432)]


@pytest.mark.parametrize(("address", "port"), EVERY_SERVICE)
def test_no_webhook_reaches_any_of_them_inside_an_allowed_network(failover_platform, settings, address, port):
    settings.E31_WEBHOOK_PRIVATE_NETWORKS = [ipaddress.ip_network("10.0.0.0/8")]
    with pytest.raises(addresses.Refused, match="platform"):
        addresses.checked_addresses(address, port)
    assert addresses.checked_addresses("10.9.9.9", port) == ["10.9.9.9"]  # the office network stays allowed


def test_a_platform_host_that_does_not_resolve_refuses_until_it_does(settings):
    """Its address cannot be told apart from the receiver's: the send is tried again later, as for a name of the
    receiver's own that did not resolve."""
    settings.E31_WEBHOOK_PRIVATE_NETWORKS = [ipaddress.ip_network("10.0.0.0/8")]
    settings.CELERY_BROKER_URL = "redis://broker.invalid:6379/0"
    with pytest.raises(addresses.Unresolved, match="platform"):
        addresses.checked_addresses("10.9.9.9", 6379)


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
