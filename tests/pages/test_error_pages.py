"""404, 403 and 500 answer with the console's own page and a way back, never a bare error."""

import pytest
from django.core.exceptions import PermissionDenied
from django.test import RequestFactory
from django.views import defaults

pytestmark = pytest.mark.django_db


def _looks_like_the_console(html: str) -> None:
    assert 'rel="stylesheet"' in html and "/css/app." in html
    assert '<a class="brand" href="/">' in html


def test_a_missing_page_is_the_consoles_404_with_a_way_back(client):
    response = client.get("/no/such/page/")
    html = response.content.decode()
    assert response.status_code == 404
    _looks_like_the_console(html)
    assert "Page not found" in html and 'href="/">Back to the home page</a>' in html


def test_a_signed_in_member_is_pointed_back_to_their_jobs(member_client):
    html = member_client.get("/jobs/999999/").content.decode()
    assert "Page not found" in html and 'href="/jobs/">Back to your jobs</a>' in html


def test_a_forbidden_page_is_the_consoles_403(member):
    request = RequestFactory().get("/somewhere/")
    request.user = member
    response = defaults.permission_denied(request, PermissionDenied())
    html = response.content.decode()
    assert response.status_code == 403
    _looks_like_the_console(html)
    assert "not allowed" in html and "Back to your jobs" in html


def test_a_server_error_is_the_consoles_500_with_a_way_back():
    response = defaults.server_error(RequestFactory().get("/boom/"))
    html = response.content.decode()
    assert response.status_code == 500
    _looks_like_the_console(html)
    assert "Something went wrong" in html and 'href="/">Back to the home page</a>' in html
