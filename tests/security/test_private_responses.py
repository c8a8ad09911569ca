"""A signed-in page or an API answer is the team's own: no shared cache keeps it, no browser cache stores it.

Without Cache-Control a proxy that caches by heuristics, or the disk cache of a shared machine, keeps the
page that showed a new API token or a webhook's signing secret once, a job's argv and log tail, the ledger.
"""

import ipaddress

import pytest
from django.test import Client
from django.urls import reverse

from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def _kept_by_nobody(response) -> bool:
    directives = {d.strip() for d in response.get("Cache-Control", "").split(",")}
    return {"private", "no-store"} <= directives


def test_the_page_showing_a_new_api_token_is_stored_by_no_cache(member_client):
    response = member_client.post(reverse("accounts:tokens"), {"label": "laptop"}, follow=True)
    assert response.status_code == 200 and b'id="new-token">e31_' in response.content
    assert _kept_by_nobody(response), response.get("Cache-Control")


def test_the_page_showing_a_new_webhook_secret_is_stored_by_no_cache(team_admin, team, settings):
    settings.E31_WEBHOOK_PRIVATE_NETWORKS = [ipaddress.ip_network("10.0.0.0/8")]
    client = Client()
    client.force_login(team_admin)
    response = client.post(
        reverse("notifications:webhooks", args=[team.slug]), {"url": "http://10.2.3.4/hook", "secret": ""}
    )
    assert response.status_code == 200 and b'class="token"' in response.content
    assert _kept_by_nobody(response), response.get("Cache-Control")


@pytest.mark.parametrize(
    "what", ["job page", "job live fragment", "ledger", "ledger CSV", "API job (session)"]
)
def test_a_signed_in_members_pages_are_stored_by_no_cache(what, member_client, member, team):
    job = JobFactory(team=team, submitted_by=member, name="secret-project")
    url = {
        "job page": reverse("jobs:detail", args=[job.id]),
        "job live fragment": reverse("jobs:live", args=[job.id]),
        "ledger": reverse("metering:ledger"),
        "ledger CSV": reverse("metering:export_csv"),
        "API job (session)": f"/api/v1/jobs/{job.id}",
    }[what]
    response = member_client.get(url)
    assert response.status_code == 200
    assert _kept_by_nobody(response), (url, response.get("Cache-Control"))


def test_an_api_answer_to_a_token_is_stored_by_no_cache(client, member, team, member_token):
    job = JobFactory(team=team, submitted_by=member)
    response = client.get(f"/api/v1/jobs/{job.id}", HTTP_AUTHORIZATION=f"Bearer {member_token}")
    assert response.status_code == 200
    assert _kept_by_nobody(response), response.get("Cache-Control")


def test_a_refused_bearer_request_is_stored_by_no_cache_either(client):
    response = client.get("/api/v1/jobs", HTTP_AUTHORIZATION="Bearer e31_wrong")
    assert response.status_code == 401
    assert _kept_by_nobody(response), response.get("Cache-Control")


def test_public_pages_for_visitors_keep_their_own_caching(client):
    response = client.get(reverse("unsolved"))
    assert response.status_code == 200
    assert "no-store" not in response.get("Cache-Control", "")
