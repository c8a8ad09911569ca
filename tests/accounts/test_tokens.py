"""Per-user API tokens: shown once, stored hashed, revocable, sent as a Bearer header."""

import hashlib
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.urls import clear_script_prefix, reverse, set_script_prefix
from django.utils import timezone

from accounts import selectors, services
from accounts.models import ApiToken
from jobs.models import Job
from tests.cli.inprocess import e31
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_the_command_prints_a_token_once_and_stores_only_its_hash(member):
    out = StringIO()
    call_command("create_api_token", "alice", stdout=out)
    token = out.getvalue().strip()
    row = ApiToken.objects.get(user=member)
    assert token.startswith("e31_") and len(token) > 40
    assert row.digest == hashlib.sha256(token.encode()).hexdigest()
    assert token not in {row.digest, row.prefix, row.label}


def test_the_command_refuses_an_unknown_user(db):
    with pytest.raises(CommandError, match="no active user"):
        call_command("create_api_token", "nobody")


def test_a_token_created_on_the_page_works_until_it_is_revoked(member_client, member, client):
    page = member_client.post(reverse("accounts:tokens"), {"label": "laptop"}, follow=True)
    token = page.context["new_token"]
    assert token in page.content.decode()
    assert client.get("/api/v1/jobs", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200
    row = ApiToken.objects.get(user=member)
    member_client.post(reverse("accounts:revoke-token", args=[row.id]))
    assert client.get("/api/v1/jobs", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 401
    assert token not in member_client.get(reverse("accounts:tokens")).content.decode()


def test_reloading_the_page_that_showed_a_new_token_makes_no_second_one(member_client, member):
    """The token was shown in the answer to the POST: reloading that page posted the form again, and made
    another token. The POST now redirects; the page shows the new token once, and a reload shows it no more."""
    created = member_client.post(reverse("accounts:tokens"), {"label": "laptop"})
    assert created.status_code == 302 and created["Location"] == reverse("accounts:tokens")
    shown = member_client.get(reverse("accounts:tokens"))
    token = shown.context["new_token"]
    assert token and token in shown.content.decode()
    again = member_client.get(reverse("accounts:tokens"))
    assert again.context["new_token"] is None and token not in again.content.decode()
    assert ApiToken.objects.filter(user=member).count() == 1
    # Nothing of it is kept on the server: the session holds no token.
    assert token not in str(dict(member_client.session.items()))


def test_a_new_token_is_shown_to_its_own_user_only(member_client, member, outsider):
    created = member_client.post(reverse("accounts:tokens"), {"label": "laptop"})
    member_client.force_login(outsider)  # another account signed in on the same browser, at once
    shown = member_client.get(reverse("accounts:tokens"))
    assert shown.context["new_token"] is None
    assert (
        created.cookies["e31_new_token"]["httponly"]
        and created.cookies["e31_new_token"]["samesite"] == "Strict"
    )


def test_the_tokens_page_links_the_api_where_the_console_serves_it(member_client):
    """A console served under a path prefix (the README's deployment allows one): the link to the API and the
    curl example named /api/v1/ at the host's root, where nothing answers."""
    page_path = reverse("accounts:tokens")
    member_client.post(page_path, {"label": "laptop"})
    set_script_prefix("/console/")  # as the WSGI handler does for a request under the prefix
    try:
        page = member_client.get(page_path).content.decode()
    finally:
        clear_script_prefix()
    assert 'href="/console/api/v1/docs"' in page and "/console/api/v1/jobs</code>" in page


def test_nobody_can_revoke_another_users_token(member, outsider_client):
    row, _ = __import__("accounts.services", fromlist=["x"]).create_api_token(user=member, label="x")
    outsider_client.post(reverse("accounts:revoke-token", args=[row.id]))
    row.refresh_from_db()
    assert row.revoked_at is None


def test_a_wrong_or_missing_token_is_a_401_with_json(client):
    assert client.get("/api/v1/jobs").status_code == 401
    response = client.get("/api/v1/jobs", HTTP_AUTHORIZATION="Bearer e31_not-a-token")
    assert response.status_code == 401 and "detail" in response.json()


def test_a_token_after_two_spaces_authenticates(client, member_token):
    """A script sends `Authorization: Bearer  <token>` (RFC 7235 allows more than one space): the token is read
    without the spaces and the request is answered."""
    response = client.get("/api/v1/jobs", HTTP_AUTHORIZATION=f"Bearer  {member_token} ")
    assert response.status_code == 200, response.json()


def test_a_live_token_of_an_active_user_is_never_called_a_deactivated_users(member, member_token):
    """Whatever refused a live token of an active user (it changed while the request ran), its holder is not
    sent to an operator about a deactivation that did not happen."""
    assert "deactivated" not in selectors.why_token_refused(member_token)


def test_the_login_page_signs_a_member_in(client, member):
    response = client.post(
        reverse("accounts:login"), {"username": "alice", "password": "correct horse battery"}
    )
    assert response.status_code == 302 and response["Location"] == reverse("jobs:list")


def test_a_revoked_token_makes_room_for_a_new_one_and_the_command_says_why_it_refuses(member):
    rows = [services.create_api_token(user=member, label=f"t{n}")[0] for n in range(services.ACTIVE_TOKENS)]
    with pytest.raises(CommandError, match="revoke one"):
        call_command("create_api_token", "alice", stdout=StringIO())
    assert services.revoke_api_token(token_id=rows[0].id, user=member, now=timezone.now())
    out = StringIO()
    call_command("create_api_token", "alice", stdout=out)
    assert out.getvalue().startswith("e31_")
    assert ApiToken.objects.filter(user=member, revoked_at__isnull=True).count() == services.ACTIVE_TOKENS


def test_the_tokens_page_says_why_it_made_no_token_past_the_limit(member_client, member):
    for n in range(services.ACTIVE_TOKENS):
        services.create_api_token(user=member, label=f"t{n}")
    page = member_client.post(reverse("accounts:tokens"), {"label": "one more"})
    assert page.status_code == 409 and page.context["new_token"] is None
    assert f"No token was created: you have {services.ACTIVE_TOKENS} active tokens" in page.content.decode()
    assert ApiToken.objects.filter(user=member).count() == services.ACTIVE_TOKENS


def test_a_read_only_token_reads_and_is_refused_every_change_saying_why(member, team, client):
    """A dashboard or a CI job that only watches needs no power to submit, cancel or re-run: a token made read-only
    lists jobs, logs and the ledger, and each change is a 403 saying what the token may do."""
    job = JobFactory(team=team, submitted_by=member, state="queued")
    _, token = services.create_api_token(user=member, label="dashboard", read_only=True)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    assert client.get("/api/v1/jobs", **auth).status_code == 200
    assert client.get(f"/api/v1/jobs/{job.id}", **auth).status_code == 200
    for path in (f"/api/v1/jobs/{job.id}/cancel", f"/api/v1/jobs/{job.id}/rerun", "/api/v1/jobs"):
        refused = client.post(path, {}, content_type="application/json", **auth)
        assert refused.status_code == 403, (path, refused.content[:200])
        assert "read-only" in refused.json()["detail"], refused.json()
    assert client.get(f"/api/v1/jobs/{job.id}", **auth).json()["state"] == "queued"


def test_the_page_makes_a_read_only_token_and_says_which_tokens_can_change_things(
    member_client, member, client
):
    member_client.post(reverse("accounts:tokens"), {"label": "dashboard", "read_only": "on"})
    member_client.post(reverse("accounts:tokens"), {"label": "laptop"})
    assert dict(ApiToken.objects.filter(user=member).values_list("label", "read_only")) == {
        "dashboard": True,
        "laptop": False,
    }
    page = member_client.get(reverse("accounts:tokens")).content.decode()
    assert "read only" in page and "read and change" in page


def test_the_command_makes_a_read_only_token(member):
    out = StringIO()
    call_command("create_api_token", "alice", "--read-only", stdout=out)
    assert ApiToken.objects.get(user=member).read_only is True


def test_e31_with_a_read_only_token_lists_and_cannot_cancel(monkeypatch, member, team):
    job = JobFactory(team=team, submitted_by=member, state="queued")
    _, token = services.create_api_token(user=member, label="dashboard", read_only=True)
    assert e31(monkeypatch, token, "ls")[0] == 0
    assert e31(monkeypatch, token, "cancel", str(job.id))[0] == 3  # the API's 403 says why (above)
    assert Job.objects.get(id=job.id).state == "queued"
