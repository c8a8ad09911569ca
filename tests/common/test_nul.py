"""A NUL character in a path, query or form value is a 400, never a 500 from PostgreSQL."""

import pytest
from django.urls import reverse

from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_a_nul_anywhere_a_user_can_put_one_is_a_400(member_client, member_token, team, team_admin, client):
    job = JobFactory(team=team, state="released", end_reason="succeeded")
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {member_token}"}
    answers = {
        "page query": member_client.get(f"/jobs/{job.id}/outputs/download/?path=%00"),
        "api query": member_client.get(f"/api/v1/jobs/{job.id}/outputs/download?path=%00", **bearer),
        "api path": member_client.get("/api/v1/teams/%00/secrets", **bearer),
        "api put": member_client.put("/api/v1/notifications/email/%00", "{}", "application/json", **bearer),
    }
    client.force_login(team_admin)
    answers["form post"] = client.post(reverse("accounts:delete-secret", args=[team.slug]), {"name": "A\x00"})
    assert {name: r.status_code for name, r in answers.items()} == dict.fromkeys(answers, 400)
    assert answers["api path"].json()["detail"].startswith("A request cannot carry a NUL")


def test_a_request_refused_for_a_nul_carries_the_headers_every_page_does(member_client):
    response = member_client.get("/jobs/?q=%00")
    assert response.status_code == 400
    assert response["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in response["Content-Security-Policy"]
