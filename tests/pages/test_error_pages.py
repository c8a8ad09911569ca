"""400, 404, 403 (CSRF too) and 500 answer with the console's own page and a way back, never a bare error."""

import pytest
from django.core.exceptions import PermissionDenied
from django.test import Client, RequestFactory
from django.views import defaults

from jobs.models import Job

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


def test_a_form_over_the_request_size_limit_is_the_consoles_400_naming_the_size_and_the_limit(
    member_client, team, pool, roots
):
    """A 3 MB script pasted into the Command box: Django refuses the body (DATA_UPLOAD_MAX_MEMORY_SIZE)."""
    script = "python3\n-c\n" + "x" * (3 * 1024 * 1024)
    response = member_client.post(
        "/jobs/new/",
        {"name": "big", "work.argv": script, "request.gpus": "1", "request.hours": "1", "output.bytes": "1"},
    )
    html = response.content.decode()
    assert response.status_code == 400
    assert not Job.objects.exists()
    _looks_like_the_console(html)
    assert "What you sent (3.0\xa0MB) is larger than the console accepts in one form (2.5\xa0MB)" in html
    assert 'href="/">Back to the home page</a>' in html


def test_a_nul_in_a_form_is_the_consoles_400_saying_so(client):
    response = client.get("/unsolved/?q=%00")
    html = response.content.decode()
    assert response.status_code == 400
    _looks_like_the_console(html)
    assert "cannot carry a NUL character" in html


def test_a_sign_in_refused_by_csrf_is_the_consoles_page_with_a_way_back_to_the_form():
    """The sign-in form posted without its CSRF cookie (cleared cookies, a tab left open across a restart)."""
    client = Client(enforce_csrf_checks=True)
    response = client.post("/accounts/login/", {"username": "alice", "password": "x"})
    html = response.content.decode()
    assert response.status_code == 403
    _looks_like_the_console(html)
    assert "This form has expired" in html and "cookies must be allowed" in html
    assert 'href="/accounts/login/">Open the page again</a>' in html
    # The page sets a fresh token, so the form opened again is accepted.
    assert "csrftoken" in response.cookies
