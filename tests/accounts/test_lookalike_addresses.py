"""An address that only looks like another never takes it: addresses become accounts in one plain form.

Found by trying it: identity lookups compare addresses case-blind (``iexact``, UPPER() on PostgreSQL), and
UPPER('\u0131') is 'I'. A team admin invited victim@gma\u0131l.com (a dotless i, U+0131: another, registrable domain), read
the mail there and set a password; from then on victim@gmail.com counted as taken by that account. The
real person's invitations and design-partner application were tied to it or refused, and signing in as
victim@gmail.com reached it. Now the domain is kept in its ASCII (IDNA) form and a local part outside ASCII
is refused, so no two stored addresses differ only in a way case-blind lookups fold away.
"""

from datetime import UTC

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.urls import reverse

from accounts import selectors, services
from accounts.forms import InviteForm
from public.forms import ApplicationForm
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

REAL = "victim@gmail.com"
LOOKALIKE_DOMAIN = "victim@gma\u0131l.com"  # dotless i
LOOKALIKE_LOCAL = "v\u0131ctim@gmail.com"


def test_a_lookalike_domain_is_kept_in_its_ascii_form_and_never_names_the_real_address():
    form = InviteForm({"email": LOOKALIKE_DOMAIN})
    assert form.is_valid(), form.errors
    stored = form.cleaned_data["email"]
    assert stored == "victim@xn--gmal-nza.com"
    UserFactory(username=stored, email=stored)
    assert not selectors.address_taken(REAL)
    assert selectors.account_for_address(REAL) is None


def test_a_local_part_outside_ascii_is_refused_saying_why():
    form = InviteForm({"email": LOOKALIKE_LOCAL})
    assert not form.is_valid()
    assert "ASCII" in str(form.errors["email"])
    assert not get_user_model().objects.exists()


def test_an_ordinary_address_is_only_lowercased():
    form = InviteForm({"email": "  Ada.Lovelace@Example.ORG "})
    assert form.is_valid() and form.cleaned_data["email"] == "ada.lovelace@example.org"


def test_a_design_partner_application_keeps_its_address_the_same_way():
    """Its address becomes the partner's sign-in when the application is accepted."""
    field = ApplicationForm().fields["email"]
    assert field.clean(LOOKALIKE_DOMAIN) == "victim@xn--gmal-nza.com"
    with pytest.raises(ValidationError, match="ASCII"):
        field.clean(LOOKALIKE_LOCAL)


def test_an_address_kept_before_the_plain_form_makes_no_account():
    """Found in review: rows stored before (a design-partner application, an invitation) still carried look-alike
    addresses, and redeeming their links made the look-alike account all the same."""
    assert services.create_invited_account(email=LOOKALIKE_DOMAIN, password="a long passphrase 31") is None
    assert services.create_invited_account(email=LOOKALIKE_LOCAL, password="a long passphrase 31") is None
    assert not selectors.address_taken(REAL) and not get_user_model().objects.exists()
    assert services.create_invited_account(email=REAL, password="a long passphrase 31").username == REAL


def _admin_user_form(user, **changes) -> dict:
    joined = user.date_joined.astimezone(UTC)
    form = {"username": user.get_username(), "email": user.email, "is_active": "on",
            "date_joined_0": joined.strftime("%Y-%m-%d"), "date_joined_1": joined.strftime("%H:%M:%S"),
            "last_login_0": "", "last_login_1": ""}  # fmt: skip
    return form | changes


def test_the_admins_account_form_keeps_addresses_in_their_plain_form(admin_client):
    """Found by review: the admin's account form stored a look-alike e-mail as typed, and an account's e-mail
    signs it in and counts as taken just as its username does."""
    user = UserFactory(username="eve")
    url = reverse("admin:auth_user_change", args=[user.id])
    assert admin_client.post(url, _admin_user_form(user, email=LOOKALIKE_DOMAIN)).status_code == 302
    user.refresh_from_db()
    assert user.email == "victim@xn--gmal-nza.com"
    assert not selectors.address_taken(REAL)

    refused = admin_client.post(url, _admin_user_form(user, email=LOOKALIKE_LOCAL, username=LOOKALIKE_LOCAL))
    assert refused.status_code == 200
    assert "ASCII" in refused.content.decode()
    user.refresh_from_db()
    assert (user.username, user.email) == ("eve", "victim@xn--gmal-nza.com")


def test_the_admins_add_form_refuses_a_lookalike_address_as_a_name_saying_why(admin_client):
    form = {"username": LOOKALIKE_LOCAL, "password1": "", "password2": "", "usable_password": "false"}
    response = admin_client.post(reverse("admin:auth_user_add"), form)
    assert response.status_code == 200
    assert "ASCII" in response.content.decode()
    assert not get_user_model().objects.filter(username__iexact=REAL).exists()


def test_no_writer_stores_a_lookalike_address_on_an_account():
    """createsuperuser, a shell: every save of a new or renamed account is checked before it is written."""
    with pytest.raises(ValidationError, match="ASCII"):
        UserFactory(username=LOOKALIKE_LOCAL)
    with pytest.raises(ValidationError, match="plain form"):
        UserFactory(username="eve", email=LOOKALIKE_DOMAIN)
    assert not selectors.address_taken(REAL)


def test_an_account_stored_before_with_a_lookalike_address_still_saves_its_other_changes():
    user = UserFactory(username="eve")
    get_user_model().objects.filter(pk=user.pk).update(email=LOOKALIKE_DOMAIN)  # as kept before the check
    user.refresh_from_db()
    user.set_password("a long passphrase 31")
    user.save()  # a password reset saves the whole row: it must not be refused for what it did not change


def test_the_admin_still_deactivates_an_account_stored_before_with_a_lookalike_address(admin_client):
    """Found in review: the form checked every address on every save, so the look-alike account an operator would
    most want switched off could not be."""
    user = UserFactory(username="eve")
    get_user_model().objects.filter(pk=user.pk).update(username=LOOKALIKE_LOCAL, email=LOOKALIKE_LOCAL)
    user.refresh_from_db()
    form = _admin_user_form(user)
    del form["is_active"]
    assert admin_client.post(reverse("admin:auth_user_change", args=[user.id]), form).status_code == 302
    user.refresh_from_db()
    assert not user.is_active and user.username == LOOKALIKE_LOCAL


def test_a_save_of_the_email_alone_is_checked_too():
    user = UserFactory(username="eve")
    user.email = LOOKALIKE_DOMAIN
    with pytest.raises(ValidationError, match="plain form"):
        user.save(update_fields=["email"])
