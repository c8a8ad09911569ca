"""A job allowed the internet never reaches the platform: the cache and every node, not only the database and broker;
and a job on one node is not even told its node's address."""

from types import SimpleNamespace

import pytest
from django.utils import timezone

from jobs import agent, rental, sandbox
from jobs.models import Allocation, Node
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db


def test_the_platform_networks_name_the_database_broker_cache_and_every_node(settings):
    db = settings.DATABASES["default"]
    # a copy: the test database's teardown keeps the real host
    settings.DATABASES = {**settings.DATABASES, "default": {**db, "HOST": "203.0.113.1"}}
    settings.CELERY_BROKER_URL = "redis://203.0.113.2:6379/0"
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": "redis://203.0.113.3:6379/1"}}  # fmt: skip
    settings.E31_EGRESS_DENY = ["198.51.100.0/24"]
    NodeFactory(address="203.0.113.4")
    NodeFactory(address="203.0.113.5:9000")
    NodeFactory(address="")
    denied = set(agent._platform_networks())
    expected = {"198.51.100.0/24", *(f"203.0.113.{n}/32" for n in range(1, 6))}
    assert expected <= denied, expected - denied


def test_the_console_the_pool_registries_and_every_failover_broker_and_cache_are_denied_too(settings):
    """Reproduction: the console's address, the pool's own registries, the second host of a failover broker
    URL and all but the first of a cache's locations were reachable by a job allowed the internet."""
    settings.E31_CONSOLE_URL = "https://203.0.113.10/"
    settings.E31_POOL_REGISTRIES = ["203.0.113.11:5000", "203.0.113.12"]
    settings.CELERY_BROKER_URL = "redis://203.0.113.13:6379/0;redis://:secret@203.0.113.14:6379/0"
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": ["redis://203.0.113.15:6379/1", "redis://203.0.113.16:6379/1"]}}  # fmt: skip
    denied = set(agent._platform_networks())
    expected = {f"203.0.113.{n}/32" for n in range(10, 17)}
    assert expected <= denied, expected - denied
    settings.CACHES["default"]["LOCATION"] = (
        "redis://203.0.113.17:6379/1,redis://203.0.113.18:6379/1"  # one string
    )
    assert {"203.0.113.17/32", "203.0.113.18/32"} <= set(agent._platform_networks())


@pytest.mark.parametrize("url", ["pyamqp://guest@203.0.113.30//", "redis://203.0.113.30:notaport/0"])
def test_a_broker_of_any_scheme_is_denied(settings, url):
    """Celery's own pyamqp:// (no port implied here) and a port that is not a number left the broker out."""
    settings.CELERY_BROKER_URL = url
    assert "203.0.113.30/32" in agent._platform_networks()


def test_a_one_node_job_is_not_told_its_nodes_platform_address(pool, team):
    """Rank, node count and coordinator are for a job spanning nodes (README); the agent's --address is the
    platform's, not the job's."""
    Node.objects.filter(name="gpu-01").update(address="10.20.30.40")
    job = JobFactory(team=team, gpus=1)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=timezone.now())
    part = agent._load_part(Allocation.objects.get(job=job).id, sandbox.BUBBLEWRAP, None)
    inside = SimpleNamespace(data="/e31/data", output="/e31/output", work="/e31/work", checkpoint=None)
    env = agent._job_env(part, inside, None)
    assert "10.20.30.40" not in env.values()
    assert not {"E31_NODE_RANK", "E31_NUM_NODES", "E31_COORDINATOR"} & set(env)


def _resolving_all_but(unresolved: str, monkeypatch) -> None:
    def getaddrinfo(host, *args, **kwargs):
        if host == unresolved:
            raise agent.socket.gaierror(-3, "Temporary failure in name resolution")
        if ":" in host:
            return [(agent.socket.AF_INET6, agent.socket.SOCK_STREAM, 6, "", (host, 0, 0, 0))]
        return [(agent.socket.AF_INET, agent.socket.SOCK_STREAM, 6, "", ("203.0.113.20", 0))]

    monkeypatch.setattr(agent.socket, "getaddrinfo", getaddrinfo)


def test_a_platform_host_that_does_not_resolve_leaves_the_part_without_egress(
    pool, team, settings, monkeypatch
):
    """Reproduction: the broker's name failing to resolve as a part started left its address off the deny list, and
    the part was wired to the internet with the broker reachable for its whole run."""
    settings.CELERY_BROKER_URL = "redis://:secret@broker.platform.example:6379/0"
    _resolving_all_but("broker.platform.example", monkeypatch)
    team.egress_allowed = True
    team.save()
    job = JobFactory(team=team, gpus=1)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=timezone.now())

    part = agent._load_part(Allocation.objects.get(job=job).id, sandbox.BUBBLEWRAP, None)

    assert part.network is None and "not wired" in part.network_note
    assert "broker.platform.example" not in part.network_note  # the platform's host names are not the job's


def test_a_node_whose_address_does_not_resolve_leaves_egress_wired_for_everyone_else(settings, monkeypatch):
    """A down node's name, or one an agent registered that only its own machine knows (``socket.getfqdn()``),
    would otherwise leave every part in the pool without internet access. An IPv6-only host has nothing to deny:
    a part's namespace has no IPv6."""
    settings.E31_EGRESS_DENY = ["198.51.100.0/24"]
    NodeFactory(address="gpu-99.gone.invalid", state=Node.NodeState.DOWN)
    NodeFactory(address="gpu-98.only-here.invalid")
    NodeFactory(address="[2001:db8::7]:9000")
    _resolving_all_but("gpu-98.only-here.invalid", monkeypatch)
    denied = agent._platform_networks()
    assert (
        "198.51.100.0/24" in denied and "203.0.113.20/32" in denied and not any(":" in net for net in denied)
    )


def test_every_host_of_a_multi_host_database_setting_is_denied(settings):
    db = settings.DATABASES["default"]
    settings.DATABASES = {**settings.DATABASES, "default": {**db, "HOST": "203.0.113.21,203.0.113.22"}}
    assert {"203.0.113.21/32", "203.0.113.22/32"} <= set(agent._platform_networks())


def test_a_database_reached_on_a_unix_socket_needs_no_address_denied(settings):
    db = settings.DATABASES["default"]
    settings.DATABASES = {**settings.DATABASES, "default": {**db, "HOST": "/var/run/postgresql"}}
    settings.CELERY_BROKER_URL, settings.E31_CONSOLE_URL = "redis://192.0.2.1:6379/0", "https://192.0.2.2/"
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.E31_EGRESS_DENY = ["198.51.100.0/24"]
    assert (
        "198.51.100.0/24" in agent._platform_networks()
    )  # a folder is not taken for a host that did not resolve
