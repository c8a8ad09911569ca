"""Reads for accounts: why an API token was refused; a team's members and open invitations."""

from datetime import datetime

from django.contrib.auth import get_user_model
from django.db.models import Q, QuerySet

from accounts import backends, services
from accounts.models import ApiToken, Membership, Team, TeamInvitation

NEW_TOKEN = "create a new one on the API tokens page"


def why_token_refused(token: str) -> str:
    """What is wrong with a token that authenticates nobody, in words its holder can act on.

    Only the token's holder learns anything: the row is found by the token's own digest.
    """
    if not token:
        return "The Bearer token is empty: send 'Authorization: Bearer <token>'."
    if not token.startswith(services.TOKEN_PREFIX):
        return (
            f"The token does not look like an E31 token (they start with {services.TOKEN_PREFIX!r}): "
            "copy it whole, or " + NEW_TOKEN + "."
        )
    row = ApiToken.objects.select_related("user").filter(digest=services.digest_token(token)).first()
    if row is None:
        return f"The token is not known (mistyped or cut short?): check it, or {NEW_TOKEN}."
    if row.revoked_at is not None:
        return f"The token {row.prefix}… was revoked on {row.revoked_at:%Y-%m-%d %H:%M} UTC: {NEW_TOKEN}."
    if not row.user.is_active:
        return f"The token {row.prefix}… belongs to a deactivated user: ask an operator."
    # Live and its user active: it was revoked or its user deactivated and restored while the request ran.
    return f"The token {row.prefix}… was refused while it changed: send the request again."


def team_members(team: Team) -> QuerySet[Membership]:
    return Membership.objects.filter(team=team).select_related("user").order_by("user__username")


def open_invitations(team: Team) -> QuerySet[TeamInvitation]:
    """The team's unused invitations, expired ones included (an admin renews or cancels them), soonest first."""
    return TeamInvitation.objects.filter(team=team, used_at__isnull=True).select_related("invited_by")


def account_for_address(email: str):
    """The one account this address names, read as sign-in reads it (``backends.stored_username``): the
    username (an invited person's is their address), else the one account with that e-mail address. Two
    accounts that could be meant name nobody: never a guess between accounts."""
    if not email:
        return None
    return get_user_model()._default_manager.filter(username=backends.stored_username(email)).first()


def address_taken(email: str) -> bool:
    """Whether an account already goes by this address, as its username or its e-mail (either signs it in,
    whatever the case): a new account named by it would take the address from that one."""
    users = get_user_model()._default_manager
    return users.filter(Q(username__iexact=email) | Q(email__iexact=email) & ~Q(email="")).exists()


def usable_team_invitation(*, token: str, now: datetime) -> TeamInvitation | None:
    """The team invitation this token opens, if it is still unused and unexpired."""
    if not token or len(token) > 100:
        return None
    return (
        TeamInvitation.objects.select_related("team", "invited_by")
        .filter(digest=services.digest_token(token), used_at__isnull=True, expires_at__gt=now)
        .first()
    )
