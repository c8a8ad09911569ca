"""An address that is an account's e-mail signs that account in: intake never makes a second account of it, which
would take the address from the first (sign-in reads a username before an e-mail address)."""

import pytest
from django.utils import timezone

from accounts import selectors as accounts_selectors
from public import services
from tests.conftest import PASSWORD
from tests.factories import UserFactory
from tests.pages.factories import ApplicationFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _a_fast_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _sign_in(client, username: str, password: str = PASSWORD):
    return client.post(
        "/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR="203.0.113.7"
    )


def test_an_address_that_is_an_accounts_e_mail_is_refused_at_accept(db):
    UserFactory(username="frank", email="frank@example.com")
    application = ApplicationFactory(email="frank@example.com")
    with pytest.raises(services.IntakeError):
        services.accept_application(
            application_id=application.id, team_name="Frank lab", by="olga", now=timezone.now()
        )


def test_an_accounts_e_mail_still_signs_it_in_after_an_application_from_that_address(client):
    frank = UserFactory(username="frank", email="frank@example.com")
    response = _sign_in(client, "Frank@example.com")
    assert response.status_code == 302 and client.session["_auth_user_id"] == str(frank.id)
    client.logout()

    application = ApplicationFactory(email="frank@example.com")
    try:
        _, token = services.accept_application(
            application_id=application.id, team_name="Frank lab", by="olga", now=timezone.now()
        )
        digest = accounts_selectors.link_digest(token)
        services.redeem_invitation(digest=digest, password="another long password 42", now=timezone.now())
    except (services.IntakeError, services.InvitationRefused):
        pass  # refused: the address keeps naming frank

    response = _sign_in(client, "Frank@example.com")
    assert response.status_code == 302 and client.session.get("_auth_user_id") == str(frank.id), (
        "frank's e-mail address now names the partner account made from it: frank cannot sign in with it"
    )
