"""Writers for a team's members and its open invitations: the only code that adds, invites, changes or removes.
``claim_invitation`` spends a design partner's link too (``public.services``): both kinds are claimed alike.
An invitation never makes an existing account a member by itself: whoever is signed in as that account accepts
its link (``accept_team_invitation``), which went to the address, so the account joins only by its owner's consent.

Each change of a team takes the team's row lock first, so changes to one team run one after another: the
checks that the actor is still one of its admins and that the team keeps an admin read what the change before
committed (two admins demoting each other at once leave one admin, never none). Each change is signalled
(``accounts.signals.membership_changed``) inside its transaction, for the operators' audit log.
"""

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from accounts import scoping, selectors, services, signals
from accounts.models import InvitationLink, Membership, Team, TeamInvitation

ADMIN, MEMBER = Membership.Role.ADMIN, Membership.Role.MEMBER
INVITATION_TTL_S = 7 * 86400  # as the design-partner invitation: E31_INVITATION_TTL_S sets both


class MembershipRefused(Exception):
    """The change cannot happen as asked; the message is meant for the admin who asked."""


class NotTeamAdmin(MembershipRefused):
    """Only the team's admins (and operators) change its members."""


class InvitationRefused(Exception):
    """The invitation link is unknown, altered, cancelled, already used or expired, or can make no account now;
    the message is meant for the person invited."""


@dataclass(frozen=True)
class Invited:
    """What inviting an address did: ``invited`` it by link (``token`` shown once), or nothing, the account it
    names being a ``member`` already."""

    outcome: str
    user: Any = None
    invitation: TeamInvitation | None = None
    token: str = ""


@transaction.atomic
def invite_member(*, team: Team, email: str, actor, now: datetime) -> Invited:
    """Sends the address a single-use link to join the team, whether or not an account goes by it: nobody is
    made a member without their consent (inviting it again renews its one open link: the old one stops working)."""
    _lock_as_admin(team=team, actor=actor)
    email = email.strip().lower()
    # The admin is told "invited" whether or not the address has an account (the account's owner joins by
    # confirming, signed in, on the link's page), so the page does not tell who has an account. Only an
    # address that is already a member here is said to be one: the members list shows it anyway.
    user = selectors.account_for_address(email)
    if user is None and selectors.address_taken(email):
        # Accounts share the address, so it names none of them, and a link would be refused when used.
        raise MembershipRefused(
            f"{email} is the address of more than one account, so it cannot be invited: nothing was sent. "
            "Ask an operator to add the person you mean."
        )
    if user is not None and selectors.is_member(team, user):
        return Invited(outcome="member", user=user)
    return _invite_by_link(team=team, email=email, actor=actor, now=now)


def _invite_by_link(*, team: Team, email: str, actor, now: datetime) -> Invited:
    token = secrets.token_urlsafe(32)
    fields = {
        "digest": services.digest_token(token),
        "invited_by": actor if getattr(actor, "pk", None) else None,
        "created_at": now,
        "expires_at": now + invitation_ttl(),
    }
    invitation, created = TeamInvitation.objects.update_or_create(
        team=team, email=email, used_at__isnull=True, defaults=fields
    )
    after = {"invited": email, "expires_at": invitation.expires_at.isoformat(), "renewed": not created}
    announce_change(team, "team.member-invite", {}, after, actor=actor, now=now)
    return Invited(outcome="invited", invitation=invitation, token=token)


def invitation_ttl() -> timedelta:
    # Read at call time so an environment (or a test) can shorten it without a code change.
    return timedelta(seconds=getattr(settings, "E31_INVITATION_TTL_S", INVITATION_TTL_S))


@transaction.atomic
def cancel_invitation(*, team: Team, invitation_id: int, actor, now: datetime) -> bool:
    """Withdraws an unused invitation: its link stops working. Refused, with the reason, if it was used or
    withdrawn already: the admin must not think a link that made an account was stopped."""
    _lock_as_admin(team=team, actor=actor)
    open_ = TeamInvitation.objects.filter(id=invitation_id, team=team, used_at__isnull=True)
    email = open_.values_list("email", flat=True).first()
    # Redemption does not take the team's lock: the delete is conditional too, and finds nothing if the link
    # was used in between.
    if email is None or not open_.delete()[0]:
        raise MembershipRefused(_why_not_cancelled(team=team, invitation_id=invitation_id))
    announce_change(team, "team.invitation-cancel", {"invited": email}, {}, actor=actor, now=now)
    return True


def _why_not_cancelled(*, team: Team, invitation_id: int) -> str:
    used_by = (
        TeamInvitation.objects.filter(id=invitation_id, team=team).values_list("email", flat=True).first()
    )
    if used_by is None:
        return "this invitation had already been cancelled: nothing was cancelled"
    return (
        f"{used_by} had already used this invitation and joined the team: nothing was cancelled "
        "(remove them from the team instead)"
    )


@transaction.atomic
def change_role(*, team: Team, user_id: int, role: str, actor, now: datetime) -> bool:
    """Makes a member an admin or an admin a member; never the team's last admin. False if nothing changed."""
    if role not in Membership.Role.values:
        raise MembershipRefused(f"a role is one of {', '.join(Membership.Role.values)}")
    _lock_as_admin(team=team, actor=actor)
    membership = _membership(team=team, user_id=user_id)
    if membership.role == role:
        return False
    if role != ADMIN:
        _keep_an_admin(membership, "demoted")
        _cancel_invitations_by(membership, team=team, actor=actor, now=now)
    Membership.objects.filter(id=membership.id).update(role=role)
    member = membership.user.get_username()
    announce_change(team, "team.member-role", {"member": member, "role": membership.role}, {"member": member, "role": role},
             actor=actor, now=now)  # fmt: skip
    return True


@transaction.atomic
def remove_member(*, team: Team, user_id: int, actor, now: datetime) -> bool:
    """Takes a member out of the team: from the next request on, none of its jobs, ledger or secrets are theirs
    to see. An admin removes anyone; any member may leave (``user_id`` their own). Never the team's last admin."""
    if user_id == actor.pk:
        _lock_team(team)
    else:
        _lock_as_admin(team=team, actor=actor)
    membership = _membership(team=team, user_id=user_id)
    _keep_an_admin(membership, "removed")
    _cancel_invitations_by(membership, team=team, actor=actor, now=now)
    Membership.objects.filter(id=membership.id).delete()
    before = {"member": membership.user.get_username(), "role": membership.role}
    announce_change(team, "team.member-remove", before, {}, actor=actor, now=now)
    return True


@transaction.atomic
def redeem_team_invitation(*, digest: str, password: str, now: datetime) -> Any:
    """Uses a team invitation once: creates the account (its username the address) and makes it a member, while
    whoever sent the link is still an admin of the team who can sign in."""
    invitation = selectors.usable_team_invitation(digest=digest, now=now)
    if invitation is None:
        raise InvitationRefused("this invitation link is not valid")
    if not selectors.inviter_vouches(invitation):
        raise InvitationRefused(selectors.INVITER_GONE)
    user = claim_invitation(invitation=invitation, password=password, now=now)
    Membership.objects.create(team=invitation.team, user=user, role=MEMBER)
    by = invitation.invited_by.get_username()  # there is one: it vouches
    after = {"member": user.get_username(), "role": MEMBER, "invited_by": by}
    announce_change(invitation.team, "team.member-join", {}, after, actor=user, now=now)
    return user


@transaction.atomic
def accept_team_invitation(*, digest: str, user, now: datetime) -> Membership:
    """Uses a team invitation whose address names an existing account once: that account, and only it (signed
    in, confirming), becomes a member, while whoever sent the link is still an admin of the team who can sign in.
    """
    invitation = selectors.usable_team_invitation(digest=digest, now=now)
    if invitation is None:
        raise InvitationRefused("this invitation link is not valid")
    # The team's lock, as every change of its members takes: the membership and the sender read below are what
    # the change before committed (a confirmation racing a removal of the sender, say, waits and then sees it).
    Team.objects.select_for_update().filter(id=invitation.team_id).values_list("id", flat=True).get()
    _check_joining(invitation, user)
    _spend(invitation, now=now)
    TeamInvitation.objects.filter(id=invitation.id).update(user=user)
    membership = Membership.objects.create(team=invitation.team, user=user, role=MEMBER)
    by = invitation.invited_by.get_username()  # there is one: it vouches
    after = {"member": user.get_username(), "role": MEMBER, "invited_by": by}
    announce_change(invitation.team, "team.member-join", {}, after, actor=user, now=now)
    return membership


def _check_joining(invitation: TeamInvitation, user) -> None:
    if not selectors.inviter_vouches(invitation):
        raise InvitationRefused(selectors.INVITER_GONE)
    account = selectors.account_for_address(invitation.email)
    if account is None or account.pk != user.pk:
        raise InvitationRefused(selectors.wrong_account_reason(invitation, user))
    if not account.is_active:
        raise InvitationRefused("this account is deactivated and cannot join a team: ask an operator")
    # Said, and the link left unspent: a spent link records the account it made a member (the admin's cancel
    # says so), and this one made nobody one. The admin sees the member on the list and cancels the link.
    if selectors.is_member(invitation.team, user):
        raise InvitationRefused(f"you are already a member of team {invitation.team.name}")


def _spend(invitation: InvitationLink, *, now: datetime) -> None:
    # The claim is the conditional UPDATE: of two redemptions racing (or a redemption and a cancel), one wins.
    # It matches the digest too: inviting the address again (or sending the link again) renews this row, and the
    # old token stops working even if it was read a moment before the renewal.
    claimed = (
        type(invitation)
        .objects.filter(id=invitation.id, digest=invitation.digest, used_at__isnull=True, expires_at__gt=now)
        .update(used_at=now)
    )
    if not claimed:
        raise InvitationRefused("this invitation link has just been used, renewed or cancelled")


@transaction.atomic
def claim_invitation(
    *, invitation: InvitationLink, password: str, now: datetime, first_name: str = ""
) -> Any:
    """Spends an open invitation link, a team admin's or a design partner's (``public.services``), and makes
    the account it names, for the caller to add to the team. Refused if an account goes by the address (an
    account joins a team by ``accept_team_invitation``, signed in as itself)."""
    _spend(invitation, now=now)
    # Never hand an existing account to whoever holds a link. None from the writer: another link for the address
    # made its account a moment ago. Raising undoes the claim, so the link still shows the reason.
    user = None
    if not selectors.address_taken(invitation.email):
        user = services.create_invited_account(
            email=invitation.email, password=password, first_name=first_name
        )
    if user is None:
        raise InvitationRefused(selectors.address_taken_reason(invitation))
    type(invitation).objects.filter(id=invitation.id).update(user=user)
    return user


def _lock_team(team: Team) -> None:
    """The team's row, which every change of its members takes first."""
    Team.objects.select_for_update().filter(id=team.id).values_list("id", flat=True).get()


def _lock_as_admin(*, team: Team, actor) -> None:
    # The lock comes before the check: an admin demoted a moment ago by another admin acts no more.
    _lock_team(team)
    if not scoping.is_team_admin(actor, team):
        raise NotTeamAdmin("only a team admin changes the team's members")


def _membership(*, team: Team, user_id: int) -> Membership:
    membership = Membership.objects.select_related("user").filter(team=team, user_id=user_id).first()
    if membership is None:
        raise MembershipRefused("this person is not a member of the team (any more)")
    return membership


def _keep_an_admin(membership: Membership, change: str) -> None:
    # A deactivated admin cannot sign in: counting them would leave a team nobody can manage.
    others = selectors.admins_who_sign_in(membership.team_id).exclude(id=membership.id)
    if membership.role == ADMIN and not others.exists():
        raise MembershipRefused(
            f"{membership.user.get_username()} is the team's only admin who can sign in and cannot be "
            f"{change}: make another member an admin first"
        )


def _cancel_invitations_by(membership: Membership, *, team: Team, actor, now: datetime) -> None:
    # A link speaks for the admin who sent it: once they are no admin of the team (a rogue admin removed, say),
    # nobody vouches for it any more. Locked first, so a redemption racing the cancel waits and then finds none.
    pending = TeamInvitation.objects.filter(team=team, invited_by_id=membership.user_id, used_at__isnull=True)
    rows = list(pending.select_for_update().values_list("id", "email"))
    TeamInvitation.objects.filter(id__in=[id_ for id_, _ in rows]).delete()
    by = membership.user.get_username()
    for _, email in rows:
        announce_change(team, "team.invitation-cancel", {"invited": email, "invited_by": by}, {},
                 actor=actor, now=now)  # fmt: skip


def announce_change(team: Team, action: str, before: dict, after: dict, *, actor, now: datetime) -> None:
    """Tells the audit log (``signals.membership_changed``) of a change of the team's members or invitations, in the
    caller's transaction."""
    signals.membership_changed.send(
        sender=Membership, team=team, action=action, before=before, after=after, actor=actor, now=now
    )
