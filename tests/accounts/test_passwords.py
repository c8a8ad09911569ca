"""A member changes their own password, and one who forgot it sets a new one from a link mailed to their address.

There was neither: a forgotten password took an operator, and a password someone else had seen could not be
changed by its owner. Both changes are audited like the admin's (``user.account``, never the password); a change
signs out the account's other sessions; the reset page says the same whatever address is typed (nobody learns
which addresses have accounts), its link goes to the console's own address and works once, and its posts are
limited per client address.
"""

import re

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.test import Client
from django.urls import reverse

from accounts.passwords import CHANGE_TRIES
from operations.models import AuditEntry
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db
NEW = "a different long passphrase 77"


@pytest.fixture(autouse=True)
def _fast(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _signs_in(username: str, password: str) -> bool:
    return Client().login(username=username, password=password)


def test_a_member_changes_their_password_and_other_sessions_are_signed_out(member, settings):
    here, elsewhere = Client(), Client()
    for c in (here, elsewhere):
        assert c.login(username="alice", password=PASSWORD)
    page = here.post(
        reverse("accounts:password"), {"old_password": PASSWORD, "new_password1": NEW, "new_password2": NEW}
    )
    assert page.status_code == 302
    assert _signs_in("alice", NEW) and not _signs_in("alice", PASSWORD)
    assert here.get(reverse("jobs:list")).status_code == 200  # this session stays signed in
    assert elsewhere.get(reverse("jobs:list")).status_code == 302  # the other is signed out
    entry = AuditEntry.objects.get(action="user.account")
    assert (entry.target, entry.actor, entry.after) == ("user:alice", "alice", {"password": "set anew"})


def test_a_wrong_current_password_changes_nothing(member, member_client):
    page = member_client.post(
        reverse("accounts:password"), {"old_password": "wrong", "new_password1": NEW, "new_password2": NEW}
    )
    assert page.status_code == 422 and _signs_in("alice", PASSWORD)
    assert not AuditEntry.objects.exists()


def test_a_forgotten_password_is_set_anew_from_a_link_that_works_once(member, settings):
    member.email = "alice@example.com"
    member.save()
    client = Client()
    sent = client.post(reverse("accounts:password-reset"), {"email": "Alice@Example.com"})
    assert sent.status_code == 302 and len(mail.outbox) == 1 and mail.outbox[0].to == ["alice@example.com"]
    link = re.search(
        re.escape(settings.E31_CONSOLE_URL) + r"(/accounts/reset/\S+/)", mail.outbox[0].body
    ).group(1)
    form = client.get(link, follow=True)
    assert form.status_code == 200 and "new_password1" in form.content.decode()
    done = client.post(form.redirect_chain[-1][0], {"new_password1": NEW, "new_password2": NEW})
    assert done.status_code == 302 and _signs_in("alice", NEW)
    entry = AuditEntry.objects.get(action="user.account")
    assert entry.after == {"password": "set anew"} and entry.actor == "alice"
    again = Client().get(link, follow=True).content.decode()
    assert "new_password1" not in again and "no longer valid" in again


def test_the_reset_page_says_the_same_for_an_address_with_no_account_and_sends_nothing(member):
    known = Client().post(reverse("accounts:password-reset"), {"email": "nobody@example.com"}, follow=True)
    assert known.status_code == 200 and "If an account" in known.content.decode()
    assert mail.outbox == []


def test_reset_requests_are_limited_per_client_address(member, settings):
    settings.E31_PUBLIC_FORM_LIMIT = 2
    statuses = [
        Client()
        .post(reverse("accounts:password-reset"), {"email": "x@example.com"}, REMOTE_ADDR="203.0.113.9")
        .status_code
        for _ in range(3)
    ]
    assert statuses == [302, 302, 429]


def test_the_sign_in_page_links_the_reset_and_the_token_page_the_change(member_client, client):
    assert reverse("accounts:password-reset") in client.get(reverse("accounts:login")).content.decode()
    assert reverse("accounts:password") in member_client.get(reverse("accounts:tokens")).content.decode()
    assert get_user_model().objects.count() == 1


def test_tries_at_the_current_password_are_limited_per_account(member, member_client, still_rate_clock):
    """Found by review: wrong current passwords were answered 422 for ever, each costing a password hash (0.28 s
    with the real hasher): a session someone else had got could guess the password without limit."""
    wrong = {"old_password": "not it", "new_password1": NEW, "new_password2": NEW}
    tries = [member_client.post(reverse("accounts:password"), wrong).status_code for _ in range(CHANGE_TRIES)]
    assert tries == [422] * CHANGE_TRIES
    right = {"old_password": PASSWORD, "new_password1": NEW, "new_password2": NEW}
    refused = member_client.post(reverse("accounts:password"), right)
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert "Too many tries" in refused.content.decode()
    assert _signs_in("alice", PASSWORD) and not _signs_in("alice", NEW)
