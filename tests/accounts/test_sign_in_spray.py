"""One address trying passwords across many accounts is stopped too: E31_LOGIN_FAILURES_PER_ADDRESS.

Found by trying it: the lockout counted each (username, address) pair alone, so one address tried 9 wrong
passwords on each of 30 accounts (270 failures, each pair under its limit of 10) and was never slowed; the
right password then signed in. Failed sign-ins from one address, whatever the usernames, now lock that
address out past a limit far above one person's, so an office behind one address is not locked out by a
colleague's typos; other addresses are not affected.
"""

import pytest
from django.urls import reverse

from tests.conftest import PASSWORD
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db
LOGIN = reverse("accounts:login")


@pytest.fixture(autouse=True)
def _limits(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.E31_LOGIN_FAILURE_LIMIT = 10
    settings.E31_LOGIN_FAILURES_PER_ADDRESS = 20


def _sign_in(client, username: str, password: str, address: str = "203.0.113.7"):
    return client.post(LOGIN, {"username": username, "password": password}, REMOTE_ADDR=address)


def test_passwords_sprayed_over_many_accounts_from_one_address_lock_that_address_out(client):
    users = [UserFactory(username=f"user{i}") for i in range(5)]
    statuses = [_sign_in(client, u.username, f"guess{g}").status_code for g in range(4) for u in users]
    assert statuses == [200] * 20  # each pair far under its own limit; the address at its limit
    refused = _sign_in(client, "user4", PASSWORD)
    assert refused.status_code == 429 and refused["Retry-After"]
    assert "from your address" in refused.content.decode() and "_auth_user_id" not in client.session
    elsewhere = _sign_in(client, "user4", PASSWORD, address="198.51.100.9")
    assert elsewhere.status_code == 302


def test_a_few_failures_from_a_shared_address_lock_nobody_out(client):
    users = [UserFactory(username=f"colleague{i}") for i in range(3)]
    for u in users:
        _sign_in(client, u.username, "typo")
    assert _sign_in(client, "colleague2", PASSWORD).status_code == 302
