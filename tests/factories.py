"""factory_boy factories with literal defaults."""

import functools

import factory
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.utils import timezone

from accounts.models import Membership, Team
from common import schema
from jobs.models import Job, Node
from notifications.models import Webhook


def _hashed(raw: str) -> str:
    """Each raw password hashed once a run, by the hashers set then: the default hasher's full work factor (0.2 s
    here) for every account made held tests/accounts at 77 s, 32 s without. A salted hash shared by accounts is
    still valid in every process that checks it, a live server's too."""
    return _hash_once(raw, tuple(settings.PASSWORD_HASHERS))


@functools.cache
def _hash_once(raw: str, hashers: tuple[str, ...]) -> str:
    return make_password(raw)


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("correct horse battery", transform=_hashed)


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team

    name = factory.Sequence(lambda n: f"team-{n}")
    slug = factory.LazyAttribute(lambda t: t.name)


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    team = factory.SubFactory(TeamFactory)
    user = factory.SubFactory(UserFactory)
    role = Membership.Role.MEMBER


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node

    name = factory.Sequence(lambda n: f"gpu-{n:02d}")
    gpus = 4
    gpu_model = "virtual"
    state = Node.NodeState.UP
    sandbox = "bubblewrap"
    agent_version = factory.LazyFunction(lambda: schema.code().version)  # this code's: the scheduler uses it
    registered_at = factory.LazyFunction(timezone.now)
    state_changed_at = factory.LazyFunction(timezone.now)
    last_heartbeat = factory.LazyFunction(timezone.now)


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    team = factory.SubFactory(TeamFactory)
    name = factory.Sequence(lambda n: f"job-{n}")
    state = "queued"
    submitted_at = factory.LazyFunction(timezone.now)
    state_changed_at = factory.LazyFunction(timezone.now)
    argv = ["true"]
    gpus = 1
    hours = 1.0
    output_uri = "file:///tmp/out"
    output_bytes = 0


class WebhookFactory(factory.django.DjangoModelFactory):
    """A team's webhook, added by one of its admins: it is sent to only while they speak for the team."""

    class Meta:
        model = Webhook

    team = factory.SubFactory(TeamFactory)
    url = "https://hooks.example/e31"
    secret = "s3cret-s3cret-s3cret"
    created_at = factory.LazyFunction(timezone.now)
    created_by = factory.LazyAttribute(lambda hook: MembershipFactory(team=hook.team, role="admin").user)
