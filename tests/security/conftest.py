"""A small world for the authorization matrix: two teams, five kinds of visitor, one of everything."""

from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from accounts import services as accounts
from accounts.models import ApiToken, Team
from jobs.models import Allocation, Job, JobArray, Node
from public import services as pages
from public.models import Application, Problem
from tests.factories import JobFactory, NodeFactory
from tests.pages.factories import ApplicationFactory, ProblemFactory

# Side effects of one visitor must not change what the next one sees: the owner of team A's
# objects comes last, after everybody who should have been refused.
VISITORS = ("anonymous", "member_b", "admin_a", "operator", "member_a")


@dataclass
class World:
    team_a: Team
    team_b: Team
    users: dict[str, object]  # visitor -> user (None for anonymous)
    bearer: dict[str, str]  # visitor -> API token
    job_a: Job
    allocation_a: Allocation
    node: Node
    problem: Problem
    application: Application
    invitation_token: str
    token_a: ApiToken  # member_a's own API token
    array_a: JobArray  # team A's array, whose tasks have all ended

    def client(self, visitor: str) -> Client:
        # A server error is one more line in the matrix's report, not the end of the run.
        client = Client(raise_request_exception=False)
        if self.users[visitor] is not None:
            client.force_login(self.users[visitor])
        return client


@pytest.fixture(autouse=True)
def _fresh_rate_limits(db):
    """Rate-limit counters live in the cache: the database's table (rolled back with the test) or Redis (not)."""
    cache.clear()
    yield
    cache.clear()


def _released_job(team: Team, node: Node) -> tuple[Job, Allocation]:
    end = timezone.now() - timedelta(minutes=5)
    start = end - timedelta(hours=1)
    job = JobFactory(team=team, name="team-a-job", state="released", end_reason="succeeded", attempt=1)
    allocation = Allocation.objects.create(
        job=job, attempt=1, node=node, gpu_indices=[0], rented_at=start, started_at=start,
        released_at=end, end_reason="succeeded",
    )  # fmt: skip
    return job, allocation


@pytest.fixture
def world(team, other_team, member, outsider, team_admin, operator, settings) -> World:
    settings.E31_METRICS_TOKEN = "matrix-metrics-token-0123456789"  # without one /metrics is off for everyone
    node = NodeFactory(name="gpu-auth")
    job, allocation = _released_job(team, node)
    users = {
        "anonymous": None,
        "member_a": member,
        "member_b": outsider,
        "admin_a": team_admin,
        "operator": operator,
    }
    bearer = {name: accounts.create_api_token(user=u, label="matrix")[1] for name, u in users.items() if u}
    invited = ApplicationFactory()
    _, invitation_token = pages.accept_application(
        application_id=invited.id, team_name="Invited Lab", by="olga", now=timezone.now()
    )
    token_a, _ = accounts.create_api_token(user=member, label="revocable")
    return World(
        team_a=team, team_b=other_team, users=users, bearer=bearer, job_a=job, allocation_a=allocation,
        node=node, problem=ProblemFactory(), application=ApplicationFactory(),
        invitation_token=invitation_token, token_a=token_a,
        array_a=JobArray.objects.create(
            team=team, name="sweep", spec="0-1", size=2, first_index=0, submitted_at=timezone.now()
        ),
    )  # fmt: skip
