"""Browsers ask for /favicon.ico on every page that names no icon: a raw log, the API's JSON, its docs.

Reproduction: opening `/jobs/ID/log.txt` or `/api/v1/jobs` in a browser logged a 404 for /favicon.ico each time.
"""

import pytest
from django.templatetags.static import static


@pytest.mark.django_db
def test_favicon_ico_leads_to_the_consoles_icon(client):
    answer = client.get("/favicon.ico")

    assert answer.status_code == 302
    assert answer["Location"] == static("favicon.svg")
    icon = client.get(answer["Location"])
    assert icon.status_code == 200
    assert icon["Content-Type"] == "image/svg+xml"
