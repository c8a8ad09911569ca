"""Every operator URL: visitors are sent to sign in; signed-in non-operators find nothing there (404)."""

import pytest
from django.urls import reverse

from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def urls(team):
    node = NodeFactory(name="gpu-acl")
    job = JobFactory(team=team)
    return [
        ("get", reverse("operations:pool")),
        ("get", reverse("operations:node-action", args=[node.name, "drain"])),
        ("post", reverse("operations:node-action", args=[node.name, "mark-down"])),
        ("post", reverse("operations:node-action", args=[node.name, "retire"])),
        ("get", reverse("operations:queue")),
        ("get", reverse("operations:utilisation")),
        ("get", reverse("operations:jobs")),
        ("get", reverse("operations:job-action", args=[job.id, "cancel"])),
        ("post", reverse("operations:job-action", args=[job.id, "requeue"])),
        ("get", reverse("operations:teams")),
        ("get", reverse("operations:team", args=[team.slug])),
        ("post", reverse("operations:team", args=[team.slug])),
        ("get", reverse("operations:health")),
        ("post", reverse("operations:ledger-check")),
        ("get", reverse("operations:audit")),
    ]


def test_every_operator_url_sends_a_visitor_to_sign_in(client, urls):
    for method, url in urls:
        response = getattr(client, method)(url, {"confirm": "yes", "share": "3"})
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("accounts:login")), url


def test_every_operator_url_is_a_404_for_a_team_member_and_changes_nothing(member_client, urls, team):
    for method, url in urls:
        assert getattr(member_client, method)(url, {"confirm": "yes", "share": "3"}).status_code == 404, url
    team.refresh_from_db()
    assert team.share == 1.0


def test_the_operator_link_is_in_the_header_for_operators_only(operator_client, member_client):
    link = reverse("operations:pool")
    assert link in operator_client.get(reverse("jobs:list")).content.decode()
    assert link not in member_client.get(reverse("jobs:list")).content.decode()


def test_every_operator_page_renders_for_an_operator_without_inline_style_or_script(operator_client, team):
    pages = ["pool", "queue", "utilisation", "jobs", "teams", "health", "audit"]
    for name in pages:
        response = operator_client.get(reverse(f"operations:{name}"))
        assert response.status_code == 200, name
        page = response.content.decode()
        assert " style=" not in page and "<script>" not in page, name  # CSP: our own static files only
    assert operator_client.get(reverse("operations:team", args=[team.slug])).status_code == 200
