"""Writers for teams, memberships and API tokens."""

import hashlib
import secrets
from datetime import datetime

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils.text import slugify

from accounts.models import ApiToken, Membership, Team

TOKEN_PREFIX = "e31_"


def digest_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@transaction.atomic
def create_api_token(*, user, label: str) -> tuple[ApiToken, str]:
    """Returns the stored row and the plain token, which is never stored and never shown again."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken.objects.create(
        user=user, label=label[:80] or "token", prefix=token[:10], digest=digest_token(token)
    )
    return row, token


def revoke_api_token(*, token_id: int, user, now: datetime) -> bool:
    """Revokes one of the user's own tokens; False if it was not theirs or already revoked."""
    return bool(
        ApiToken.objects.filter(id=token_id, user=user, revoked_at__isnull=True).update(revoked_at=now)
    )


def user_for_token(*, token: str, now: datetime):
    """The active user owning this token, or None."""
    row = (
        ApiToken.objects.select_related("user")
        .filter(digest=digest_token(token), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if row is None:
        return None
    ApiToken.objects.filter(id=row.id).update(last_used_at=now)
    return row.user


@transaction.atomic
def create_team(*, name: str, share: float = 1.0) -> Team:
    return Team.objects.create(name=name, slug=slugify(name) or "team", share=share)


def create_invited_account(*, email: str, password: str, first_name: str = ""):
    """A new account whose username is the invited address, or None if another account took that username, in
    any case, first. Two links for one new address (two teams', or a team's and a design partner's) redeemed at
    the same moment both find the address free; the second then meets the first's name (``accounts.usernames``):
    the check before the insert, or the unique index if both passed it."""
    try:
        with transaction.atomic():  # a savepoint: the caller's transaction lives on to refuse cleanly
            return get_user_model().objects.create_user(
                username=email, email=email, password=password, first_name=first_name
            )
    except (IntegrityError, ValidationError):
        return None


@transaction.atomic
def add_member(*, team: Team, user, role: str = Membership.Role.MEMBER) -> Membership:
    membership, _ = Membership.objects.update_or_create(team=team, user=user, defaults={"role": role})
    return membership


@transaction.atomic
def ensure_demo_accounts(*, password: str = "") -> dict[str, str]:
    """Creates the demo operator and team member if missing; returns {username: password} of new ones.

    Each new user gets a password of its own unless ``password`` (E31_DEMO_PASSWORD) names one for both.
    """
    User = get_user_model()
    created: dict[str, str] = {}
    team = Team.objects.filter(slug="demo").first()
    new_team = team is None
    team = team or create_team(name="demo")
    # In any case: an operator who renamed "operator" to "Operator" keeps it, and no second one appears.
    operator, made = User.objects.get_or_create(
        username__iexact="operator", defaults={"username": "operator", "is_staff": True}
    )
    if made:
        created["operator"] = password or secrets.token_urlsafe(9)
        operator.set_password(created["operator"])
        operator.is_superuser = True
        operator.save()
    demo, new_demo = User.objects.get_or_create(username__iexact="demo", defaults={"username": "demo"})
    if new_demo:
        created["demo"] = password or secrets.token_urlsafe(9)
        demo.set_password(created["demo"])
        demo.save()
    if new_demo or new_team:  # an operator may have changed the demo role since: a restart keeps it
        add_member(team=team, user=demo, role=Membership.Role.ADMIN)
    return created
