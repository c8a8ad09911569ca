"""Writers for teams, memberships, API tokens, operator rights and sign-in lockouts.

A team's rename, a change of what an account or group may do beyond its teams, and a lockout cleared are each
signalled (``accounts.signals``) inside their transaction, for the operators' audit log.
"""

import hashlib
import secrets
from datetime import datetime, timedelta

from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.text import slugify

from accounts import addresses, signals
from accounts.models import ApiToken, Membership, Team

TOKEN_PREFIX = "e31_"
# Live API tokens one account may hold. Each token has its own E31_API_RATE (a laptop's loop must not starve the
# CI's token), so without a bound a user multiplied their rate by making tokens; with it, one user may send at most
# this many times the rate.
ACTIVE_TOKENS = 10


class TooManyTokens(Exception):
    pass


class BadTokenDays(ValueError):
    """A token's lifetime outside 1 to E31_TOKEN_MAX_DAYS days; the message says the range."""


def digest_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_days(raw) -> int:
    """How many days a new token lasts: 1 to E31_TOKEN_MAX_DAYS (E31_TOKEN_DAYS when not given); BadTokenDays else."""
    most = settings.E31_TOKEN_MAX_DAYS
    if raw in (None, ""):
        return min(settings.E31_TOKEN_DAYS, most)
    days = int(raw) if str(raw).strip().isdigit() else 0
    if not 1 <= days <= most:
        raise BadTokenDays(
            f"a token lasts 1 to {most} days (E31_TOKEN_MAX_DAYS): {str(raw)[:20]!r} is not one"
        )
    return days


@transaction.atomic
def create_api_token(
    *, user, label: str, days: int | None = None, read_only: bool = False
) -> tuple[ApiToken, str]:
    """Returns the stored row and the plain token, which is never stored and never shown again; it expires after
    ``days`` (``token_days``); ``read_only``: it may only read. Refused past ACTIVE_TOKENS live tokens; the user's
    row is locked first, so two creations at once cannot both pass."""
    expires_at = timezone.now() + timedelta(days=token_days(days))
    get_user_model().objects.select_for_update().filter(pk=user.pk).values_list("pk", flat=True).get()
    if ApiToken.objects.filter(_live(timezone.now()), user=user).count() >= ACTIVE_TOKENS:
        raise TooManyTokens(
            f"you have {ACTIVE_TOKENS} active tokens, the most one account may hold: revoke one you no longer use, "
            "then create the new one"
        )
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken.objects.create(
        user=user,
        label=label[:80] or "token",
        prefix=token[:10],
        digest=digest_token(token),
        expires_at=expires_at,
        read_only=read_only,
    )
    return row, token


def _live(now: datetime) -> Q:
    return Q(revoked_at__isnull=True) & (Q(expires_at__isnull=True) | Q(expires_at__gt=now))


@transaction.atomic
def revoke_api_token(*, token_id: int, user, now: datetime, actor=None) -> bool:
    """Revokes one of the user's own tokens, by the user or ``actor`` (an operator), in the audit log; False if it
    was not theirs or already revoked."""
    if not ApiToken.objects.filter(id=token_id, user=user, revoked_at__isnull=True).update(revoked_at=now):
        return False
    prefix, label = ApiToken.objects.values_list("prefix", "label").get(id=token_id)
    signals.token_revoked.send(
        sender=ApiToken, name=user.get_username(), before={"token": prefix, "label": label, "revoked": False},
        after={"token": prefix, "label": label, "revoked": True}, actor=actor or user, now=now,
    )  # fmt: skip
    return True


def user_for_token(*, token: str, now: datetime):
    """The active user owning this token, or None."""
    row = live_token(token=token, now=now)
    return row.user if row is not None else None


def live_token(*, token: str, now: datetime) -> ApiToken | None:
    """The live token of an active user (its ``user`` loaded), marked used now; None if there is none."""
    row = (
        ApiToken.objects.select_related("user")
        .filter(_live(now), digest=digest_token(token), user__is_active=True)
        .first()
    )
    if row is not None:
        ApiToken.objects.filter(id=row.id).update(last_used_at=now)
    return row


@transaction.atomic
def create_team(*, name: str, share: float = 1.0) -> Team:
    return Team.objects.create(name=name, slug=slugify(name) or "team", share=share)


@transaction.atomic
def rename_team(*, team_id: int, name: str, actor, now: datetime) -> bool:
    """Gives a team another name, audited; its slug, and so its folders and prefixes, stay. False if it had it."""
    team = Team.objects.select_for_update().get(id=team_id)
    if team.name == name:
        return False
    before = {"name": team.name}
    team.name = name
    team.save(update_fields=["name"])
    signals.team_renamed.send(
        sender=Team, team=team, before=before, after={"name": name}, actor=actor, now=now
    )
    return True


# What an account or a group holds before it is given anything beyond its teams.
NO_RIGHTS = {"is_staff": False, "is_superuser": False, "groups": [], "permissions": []}
NO_GROUP_RIGHTS = {"permissions": []}


def user_rights(*, user_id: int) -> dict:
    """What an account may do beyond its teams, as stored: operate (``is_staff``), change anything in the admin
    (``is_superuser``), and the admin permissions of its groups and its own. Its row stays locked until the
    caller's transaction ends, so two changes of one account's rights are audited one after the other."""
    return _rights(get_user_model()._default_manager.select_for_update().get(pk=user_id))


def _rights(user) -> dict:
    return {
        "is_staff": user.is_staff,
        "is_superuser": user.is_superuser,
        "groups": sorted(user.groups.values_list("name", flat=True)),
        "permissions": _permission_names(user.user_permissions.all()),
    }


def group_rights(*, group_id: int) -> dict:
    """The admin permissions a group gives each of its accounts, as stored; its row locked as ``user_rights``."""
    group = Group.objects.select_for_update().get(pk=group_id)
    return {"permissions": _permission_names(group.permissions.all())}


def _permission_names(permissions: QuerySet[Permission]) -> list[str]:
    pairs = permissions.values_list("content_type__app_label", "codename")
    return sorted(f"{app}.{codename}" for app, codename in pairs)


def announce_rights(*, kind: str, name: str, before: dict, after: dict, actor, now: datetime) -> bool:
    """Tells the audit log that an account's (``kind`` "user") or a group's rights changed, in the caller's
    transaction; ``after`` is {} for one deleted. False, and nothing told, if they did not change."""
    if before == after:
        return False
    sender = get_user_model() if kind == "user" else Group
    signals.rights_changed.send(
        sender=sender, kind=kind, name=name, before=before, after=after, actor=actor, now=now
    )
    return True


SIGN_IN_DETAILS = ("username", "email", "is_active")


def sign_in_details(user) -> dict:
    """What of an account says who signs in with it, as ``announce_account`` compares it."""
    return {field: getattr(user, field) for field in SIGN_IN_DETAILS}


def announce_account(*, name: str, before: dict, after: dict, actor, now: datetime) -> bool:
    """Tells the audit log that how an account signs in changed (``sign_in_details``, or its password), in the
    caller's transaction; False, and nothing told, if nothing did."""
    if before == after:
        return False
    signals.account_changed.send(
        sender=get_user_model(), name=name, before=before, after=after, actor=actor, now=now
    )
    return True


def announce_new_account(*, user_id: int, actor, now: datetime) -> bool:
    """Tells the audit log what a new account may do beyond its teams (``NO_RIGHTS`` before), in the caller's
    transaction; False, and nothing told, if nothing."""
    user = get_user_model()._default_manager.select_for_update().get(pk=user_id)
    return announce_rights(
        kind="user", name=user.get_username(), before=NO_RIGHTS, after=_rights(user), actor=actor, now=now
    )


@transaction.atomic
def set_operator(
    *, user_id: int, operator: bool, superuser: bool | None = None, actor, now: datetime
) -> bool:
    """Makes an account an operator (``is_staff``), a superuser too if ``superuser`` (kept as it is if None), or
    neither when not ``operator``, audited; False if it had those rights already."""
    user = get_user_model()._default_manager.select_for_update().get(pk=user_id)
    before = _rights(user)
    user.is_staff = operator
    user.is_superuser = operator and (user.is_superuser if superuser is None else superuser)
    after = _rights(user)
    if after == before:
        return False
    user.save(update_fields=["is_staff", "is_superuser"])
    return announce_rights(
        kind="user", name=user.get_username(), before=before, after=after, actor=actor, now=now
    )


@transaction.atomic
def clear_lockouts(*, attempts: QuerySet[AccessAttempt], actor, now: datetime) -> int:
    """Removes these counts of failed sign-ins (axes' rows, one per username and client address), lifting their
    lockouts; each one removed is told to the audit log. The number removed."""
    rows = list(
        attempts.select_for_update().values_list("id", "username", "ip_address", "failures_since_start")
    )
    AccessAttempt.objects.filter(id__in=[row[0] for row in rows]).delete()
    for _, username, address, failures in rows:
        before = {"ip_address": address, "failures": failures}
        signals.lockout_cleared.send(
            sender=AccessAttempt, username=username or "", before=before, actor=actor, now=now
        )
    return len(rows)


def create_invited_account(*, email: str, password: str, first_name: str = ""):
    """A new account whose username is the invited address, or None if another account took that username, in
    any case, first. Two links for one new address (two teams', or a team's and a design partner's) redeemed at
    the same moment both find the address free; the second then meets the first's name (``accounts.usernames``):
    the check before the insert, or the unique index if both passed it. An address kept before addresses had one
    plain form (``accounts.addresses``), one that could name another account, makes none."""
    try:
        if addresses.canonical(email) != email:
            return None
    except addresses.NotPlain:
        return None
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

    Each new user gets a password of its own unless ``password`` (E31_DEMO_PASSWORD) names one for both. A new
    operator's rights are audited, granted by "system".
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
        announce_new_account(user_id=operator.id, actor="system", now=timezone.now())
    demo, new_demo = User.objects.get_or_create(username__iexact="demo", defaults={"username": "demo"})
    if new_demo:
        created["demo"] = password or secrets.token_urlsafe(9)
        demo.set_password(created["demo"])
        demo.save()
    if new_demo or new_team:  # an operator may have changed the demo role since: a restart keeps it
        add_member(team=team, user=demo, role=Membership.Role.ADMIN)
    return created
