"""One account per name: two usernames never differ only by letter case or surrounding spaces, whatever path
makes or renames the account, and sign-in and its lockout read a name in any case as that one account."""

import importlib
from io import StringIO
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction
from django.urls import reverse
from django.utils import timezone

from accounts import members, selectors, services
from tests.conftest import PASSWORD
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db
User = get_user_model()
TAKEN = "an account with this name already exists"
TWINS = ["sam", "SAM", "sAm", " Sam", "Sam  "]


def _inserted(username: str) -> None:
    """An INSERT with no Python in the way (bulk_create sends no pre_save): what the database alone allows."""
    with transaction.atomic():
        User.objects.bulk_create([User(username=username)])


# --- The database -------------------------------------------------------------------------------------


@pytest.mark.parametrize("twin", TWINS)
def test_the_database_refuses_a_second_account_whose_name_differs_only_by_case_or_spaces(twin):
    UserFactory(username="Sam")
    with pytest.raises(IntegrityError):
        _inserted(twin)
    assert list(User.objects.values_list("username", flat=True)) == ["Sam"]


def test_the_database_refuses_a_rename_onto_another_accounts_name_in_another_case():
    UserFactory(username="Sam")
    other = UserFactory(username="kim")
    with pytest.raises(IntegrityError), transaction.atomic():
        User.objects.filter(id=other.id).update(username="SAM")


def test_the_migration_names_the_accounts_that_already_collide():
    """An existing pair stops the migration with the names to rename, before the index is made."""
    migration = importlib.import_module("accounts.migrations.0005_username_unique_whatever_its_case")
    with connection.cursor() as cursor:  # as before the migration; the test's rollback puts the index back
        cursor.execute(f"DROP INDEX {migration.INDEX}")
    for username in ("Sam", "sam", "kim"):
        _inserted(username)
    with pytest.raises(CommandError, match=r"'Sam', 'sam'"):
        migration.refuse_existing_twins(apps, SimpleNamespace(connection=connection))


# --- Every path that makes or renames an account --------------------------------------------------------


@pytest.mark.parametrize("twin", TWINS)
def test_saving_an_account_whose_name_another_has_in_another_case_is_refused_in_words(twin):
    UserFactory(username="Sam")
    with pytest.raises(ValidationError, match=TAKEN):
        User.objects.create_user(username=twin)
    renamed = UserFactory(username="kim")
    renamed.username = twin
    with pytest.raises(ValidationError, match=TAKEN):
        renamed.save()


def test_an_account_saved_under_its_own_name_is_not_its_own_twin():
    sam = UserFactory(username="Sam")
    sam.first_name, sam.username = "Samuel", "Sam"
    sam.save()
    assert User.objects.get(id=sam.id).first_name == "Samuel"


def test_an_invited_account_is_not_made_when_its_address_differs_from_a_username_only_by_case():
    UserFactory(username="Bob@Example.org")
    made = services.create_invited_account(email="bob@example.org", password=PASSWORD)
    assert made is None
    assert list(User.objects.values_list("username", flat=True)) == ["Bob@Example.org"]


def test_an_account_made_in_another_case_while_a_link_is_redeemed_refuses_the_link_in_words(
    team, team_admin, monkeypatch
):
    """The account appears between the claim's check and its insert: the person invited is told why."""
    now = timezone.now()
    invited = members.invite_member(team=team, email="bob@example.org", actor=team_admin, now=now)
    UserFactory(username="BOB@example.org")
    monkeypatch.setattr(selectors, "address_taken", lambda email: False)  # checked before it was made
    with pytest.raises(members.InvitationRefused, match="an account with this email already exists"):
        members.redeem_team_invitation(
            digest=services.digest_token(invited.token), password=PASSWORD, now=now
        )
    assert User.objects.filter(username__iexact="bob@example.org").count() == 1


def test_the_demo_accounts_are_not_made_again_in_another_case(settings):
    settings.E31_DEMO_PASSWORD = ""
    UserFactory(username="Operator", is_staff=True)
    UserFactory(username="DEMO")
    out = StringIO()
    call_command("ensure_demo_accounts", stdout=out)
    assert "already exist" in out.getvalue()
    assert sorted(User.objects.values_list("username", flat=True)) == ["DEMO", "Operator"]


def test_createsuperuser_refuses_a_name_another_account_has_in_another_case():
    UserFactory(username="operator")
    with pytest.raises(CommandError, match=TAKEN):
        call_command("createsuperuser", username="OPERATOR", email="", interactive=False, stdout=StringIO())
    assert list(User.objects.values_list("username", flat=True)) == ["operator"]


# --- Sign-in and its lockout ------------------------------------------------------------------------------


def _sign_in(client, username: str, password: str):
    return client.post(
        reverse("accounts:login"), {"username": username, "password": password}, REMOTE_ADDR="203.0.113.7"
    )


@pytest.fixture
def bob(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.E31_LOGIN_FAILURE_LIMIT = 3
    return UserFactory(username="Bob@Example.org")


@pytest.mark.parametrize(
    "typed", ["Bob@Example.org", "bob@example.org", "BOB@EXAMPLE.ORG", " bob@example.org "]
)
def test_an_account_signs_in_with_its_name_in_any_case(client, bob, typed):
    assert _sign_in(client, typed, PASSWORD).status_code == 302
    assert client.session["_auth_user_id"] == str(bob.id)


def test_changing_the_case_of_the_name_does_not_dodge_the_lockout(client, bob):
    for typed in ("bob@example.org", "BOB@EXAMPLE.ORG", " Bob@Example.Org "):
        assert _sign_in(client, typed, "wrong").status_code == 200
    for typed in ("Bob@Example.org", "bOB@eXAMPLE.ORG"):
        assert _sign_in(client, typed, PASSWORD).status_code == 429
    assert "_auth_user_id" not in client.session
