"""factory_boy factories with literal defaults."""

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from accounts.models import Membership, Team
from common import schema
from jobs.models import Job, Node


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("correct horse battery")


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
