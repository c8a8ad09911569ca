"""Reads for accounts: why an API token was refused; a team's members and open invitations, whether an
invitation link can still make an account, and which existing account a team's link invites."""

from datetime import datetime

from django.contrib.auth import get_user_model
from django.db.models import Q, QuerySet

from accounts import backends, scoping, services
from accounts.models import ApiToken, InvitationLink, Membership, Team, TeamInvitation

NEW_TOKEN = "create a new one on the API tokens page"
# An invitation never hands an existing account to whoever holds its link. A design partner's (its new team's
# first admin) is refused: an operator adds that account instead. A team's is accepted by that account, signed in.
ADDRESS_TAKEN = "an account with this email already exists: sign in, and ask an operator"
ACCOUNT_JOINS = (
    "an account with this email already exists: open the link again, and join the team signed in as it"
)
SHARED_ADDRESS = (
    "more than one account goes by this email address, so the link names none of them: ask an operator"
)
# A team's link speaks for the admin who sent it (accounts.members cancels it when they are demoted or removed).
INVITER_GONE = (
    "whoever sent this link is no longer an admin of the team who can sign in: "
    "ask one of its admins for a new link"
)


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
    if row.has_expired:
        return f"The token {row.prefix}… expired on {row.expires_at:%Y-%m-%d %H:%M} UTC: {NEW_TOKEN}."
    if not row.user.is_active:
        return f"The token {row.prefix}… belongs to a deactivated user: ask an operator."
    # Live and its user active: it was revoked or its user deactivated and restored while the request ran.
    return f"The token {row.prefix}… was refused while it changed: send the request again."


def team_members(team: Team) -> QuerySet[Membership]:
    return Membership.objects.filter(team=team).select_related("user").order_by("user__username")


def admins_who_sign_in(team_id: int) -> QuerySet[Membership]:
    """The team's admins whose accounts can sign in: a deactivated admin manages nothing, so never counts as one."""
    return Membership.objects.filter(team_id=team_id, role=Membership.Role.ADMIN, user__is_active=True)


def sole_admin(team: Team) -> int | None:
    """The user id of the team's only admin who can sign in (``members`` refuses to demote or remove them), or None
    when there are several (or none)."""
    ids = list(admins_who_sign_in(team.id).values_list("user_id", flat=True)[:2])
    return ids[0] if len(ids) == 1 else None


def open_invitations(team: Team) -> QuerySet[TeamInvitation]:
    """The team's unused invitations, expired ones included (an admin renews or cancels them), soonest first."""
    return TeamInvitation.objects.filter(team=team, used_at__isnull=True).select_related("invited_by")


def user_id_named(username: str) -> int | None:
    """The id of the account with this username (as signals and the audit log name a member), or None."""
    users = get_user_model()._default_manager
    return users.filter(**{users.model.USERNAME_FIELD: username}).values_list("id", flat=True).first()


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


def link_digest(token: str) -> str:
    """The SHA-256 an invitation link's token is stored and looked up by ('' for what no link could hold): the
    token itself is never kept, in the invitation's row or in the browser's session."""
    if not token or len(token) > 100:
        return ""
    return services.digest_token(token)


def usable_team_invitation(*, digest: str, now: datetime) -> TeamInvitation | None:
    """The team invitation whose link has this digest, if it is still unused and unexpired."""
    return (
        TeamInvitation.objects.select_related("team", "invited_by")
        .filter(digest=digest, used_at__isnull=True, expires_at__gt=now)
        .first()
    )


def address_taken_reason(invitation: InvitationLink) -> str:
    """Why an invitation makes no account once an account goes by its address, in words for the person invited."""
    if invitation.role == Membership.Role.ADMIN:
        return ADDRESS_TAKEN
    return ACCOUNT_JOINS if account_for_address(invitation.email) else SHARED_ADDRESS


def invited_account(invitation: InvitationLink):
    """The existing account a team's link invites, to join signed in as it; None for an address with no account
    (the link makes one) and for a design partner's link (never an existing account's)."""
    if not isinstance(invitation, TeamInvitation):
        return None
    return account_for_address(invitation.email)


def wrong_account_reason(invitation: InvitationLink, user) -> str:
    """Why someone signed in as another account than the one a team's link invites cannot use it."""
    return (
        f"this invitation is for the account {invitation.email}, and you are signed in as "
        f"{user.get_username()}: sign out, open the link again, and sign in as {invitation.email}"
    )


def is_member(team: Team, user) -> bool:
    """Whether the account is in the team (an operator who is not counts as not: they join as anyone does)."""
    return Membership.objects.filter(team=team, user=user).exists()


def speaks_for(user, team: Team) -> bool:
    """Whether ``user`` (None: a deleted account) still speaks for ``team``: an account that can sign in and is
    still one of its admins (or an operator). Not one deactivated, demoted, removed or deleted since."""
    return user is not None and user.is_active and scoping.is_team_admin(user, team)


def inviter_vouches(invitation: TeamInvitation) -> bool:
    """Whether whoever sent this team link still speaks for the team (``speaks_for``)."""
    return speaks_for(invitation.invited_by, invitation.team)
