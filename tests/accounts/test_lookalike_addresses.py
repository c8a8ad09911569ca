"""An address that only looks like another never takes it: addresses become accounts in one plain form.

Found by trying it: identity lookups compare addresses case-blind (``iexact``, UPPER() on PostgreSQL), and
UPPER('\u0131') is 'I'. A team admin invited victim@gma\u0131l.com (a dotless i, U+0131: another, registrable domain), read
the mail there and set a password; from then on victim@gmail.com counted as taken by that account. The
real person's invitations and design-partner application were tied to it or refused, and signing in as
victim@gmail.com reached it. Now the domain is kept in its ASCII (IDNA) form and a local part outside ASCII
is refused, so no two stored addresses differ only in a way case-blind lookups fold away.
"""

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

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
