"""Reads of the public record and intake, shared by the pages, the forms and the writers. Never write."""

from collections.abc import Iterable
from datetime import datetime

from django.db.models import Q
from django.utils.text import slugify

from accounts import selectors as accounts_selectors
from accounts.models import Team, TeamInvitation
from public.models import IntakeChange, Invitation, Measurement


def latest_measurements(keys: Iterable[str]) -> dict[str, Measurement]:
    """The newest measurement for each key that has one (one small query per key)."""
    latest = {}
    for key in dict.fromkeys(keys):
        row = Measurement.objects.filter(key=key).order_by("-measured_at", "-id").first()
        if row is not None:
            latest[key] = row
    return latest


def intake_is_open() -> bool:
    latest = IntakeChange.objects.order_by("-at", "-id").first()
    return bool(latest and latest.is_open)


TEAM_NAME_NEEDS = "a team name needs at least one Latin letter (a-z) or digit: the team's web address and folders are made of them"


def team_name_problem(name: str) -> str:
    """Why this team name cannot be used for a new team, or '' if it can."""
    slug = slugify(name)
    if not slug:
        return TEAM_NAME_NEEDS
    if Team.objects.filter(Q(name__iexact=name) | Q(slug=slug)).exists():
        return "a team with this name already exists"
    return ""


def has_account(email: str) -> bool:
    """Whether an account already goes by the address (its username or e-mail): an invitation to it could not
    be redeemed, and an account made from it would take the address from that one."""
    return accounts_selectors.address_taken(email)


def invitation_for_link(*, digest: str, now: datetime) -> Invitation | TeamInvitation | None:
    """What an invitation link opens, found by its token's digest (``accounts.selectors.link_digest``): an
    accepted partner's (its team's first admin) or a team admin's (a member). One page and one link shape for
    both: the person invited need not know which."""
    return usable_invitation(digest=digest, now=now) or accounts_selectors.usable_team_invitation(
        digest=digest, now=now
    )


def why_link_unusable(invitation: Invitation | TeamInvitation) -> str:
    """Why an open invitation can do nothing now, or '' if it can: a design partner's once an account took its
    address, a team's once its address names more than one account (an address that names one account is that
    account's to accept, signed in: ``accounts.selectors.invited_account``), or whose sender is no admin of the
    team now. Redeeming it is refused for that reason, in these words, so the page says so before any form."""
    if has_account(invitation.email) and accounts_selectors.invited_account(invitation) is None:
        return accounts_selectors.address_taken_reason(invitation)
    if isinstance(invitation, TeamInvitation) and not accounts_selectors.inviter_vouches(invitation):
        return accounts_selectors.INVITER_GONE
    return ""


def usable_invitation(*, digest: str, now: datetime) -> Invitation | None:
    """The design partner's invitation whose link has this digest, if it is still unused and unexpired."""
    return (
        Invitation.objects.select_related("application", "team")
        .filter(digest=digest, used_at__isnull=True, expires_at__gt=now)
        .first()
    )
