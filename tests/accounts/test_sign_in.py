"""Sign-in by username or e-mail address, whatever the case typed; never a guess between two accounts."""

import pytest
from django.contrib.auth.forms import UserCreationForm
from django.core.management import call_command
from django.urls import reverse

from tests.conftest import PASSWORD
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db
LOGIN = reverse("accounts:login")


@pytest.fixture(autouse=True)
def _a_fast_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _sign_in(client, username: str, password: str = PASSWORD):
    return client.post(LOGIN, {"username": username, "password": password}, REMOTE_ADDR="203.0.113.7")


def test_the_field_says_an_e_mail_address_is_accepted(client):
    assert "<label>Username or e-mail <input" in client.get(LOGIN).content.decode()


@pytest.mark.parametrize("typed", ["Alice", "ALICE", "alice@Example.com"])
def test_a_member_signs_in_with_their_username_in_any_case_or_their_e_mail(client, member, typed):
    member.email = "alice@example.com"
    member.save()
    response = _sign_in(client, typed)
    assert response.status_code == 302 and client.session["_auth_user_id"] == str(member.id)


def test_a_wrong_password_is_refused_whatever_the_name_typed(client, member):
    assert _sign_in(client, "ALICE", "wrong").status_code == 200
    assert "_auth_user_id" not in client.session


def test_an_e_mail_address_shared_by_two_accounts_signs_in_neither(client):
    UserFactory(username="kim", email="lab@example.com")
    UserFactory(username="lee", email="lab@example.com")
    assert _sign_in(client, "lab@example.com").status_code == 200


def test_the_admin_refuses_an_account_whose_name_differs_from_another_only_by_case(member):
    form = UserCreationForm({"username": "ALICE", "password1": PASSWORD, "password2": PASSWORD})
    assert not form.is_valid() and "username" in form.errors


def test_the_lockout_counts_failures_whatever_the_case_typed(client, member, settings):
    settings.E31_LOGIN_FAILURE_LIMIT = 2
    _sign_in(client, "alice", "wrong")
    _sign_in(client, "ALICE", "wrong")
    assert _sign_in(client, "Alice").status_code == 429


def test_an_operator_clears_the_lock_of_an_account_named_with_capitals_by_its_name(client, settings):
    """`manage.py axes_reset_username Olga` (the README's remedy) found nothing when the lockout counted the
    account as 'olga': the lock stayed. An account is counted under its own username, as typed in any case."""
    settings.E31_LOGIN_FAILURE_LIMIT = 3
    UserFactory(username="Olga", is_staff=True)
    for typed in ("Olga", "olga", "OLGA"):
        _sign_in(client, typed, "wrong")
    assert _sign_in(client, "olga").status_code == 429
    call_command("axes_reset_username", "Olga")
    assert _sign_in(client, "olga").status_code == 302


def test_a_name_that_is_no_accounts_is_counted_once_whatever_its_case(client, settings):
    settings.E31_LOGIN_FAILURE_LIMIT = 2
    _sign_in(client, "Nobody", "wrong")
    _sign_in(client, "NOBODY", "wrong")
    assert _sign_in(client, "nobody", "wrong").status_code == 429
