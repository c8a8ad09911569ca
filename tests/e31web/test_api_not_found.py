"""An API client is answered in JSON, even for a path the API does not have."""

import pytest

pytestmark = pytest.mark.django_db


def test_an_unknown_api_path_is_a_json_404(client, member_token):
    """It was Django's HTML page: `e31` printed raw HTML, and a script's JSON parser failed on it."""
    response = client.get("/api/v1/jobz", HTTP_AUTHORIZATION=f"Bearer {member_token}")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert response.json() == {"detail": "No such API path: /api/v1/jobz (see /api/v1/docs)"}


def test_a_page_that_does_not_exist_is_still_the_consoles_page(member_client):
    response = member_client.get("/jobz/")
    assert response.status_code == 404 and response["Content-Type"].startswith("text/html")
