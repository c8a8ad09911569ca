"""What operations does when metering or accounts speaks (connected in ``OperationsConfig.ready``).

Metering and accounts send their signals without importing operations; these receivers are the other end, each
writing its audit entry in the transaction of the change it was told about.
"""

from datetime import datetime

from operations import audit


def audit_budget(sender, *, team, before: dict, after: dict, operator, now: datetime, **_) -> None:
    audit.record(
        actor=operator, action="team.budget", target=f"team:{team.slug}", before=before, after=after, now=now
    )


def audit_ledger_adjustment(
    sender, *, team, allocation: int, job: int, gpu_micros: int, reason: str, operator, now: datetime, **_
) -> None:
    hours = f"{gpu_micros / 3_600_000_000:.6f}"
    after = {"allocation": allocation, "job": job, "gpu_hours": hours, "reason": reason[:300]}
    audit.record(
        actor=operator, action="ledger.adjust", target=f"team:{team.slug}", before={}, after=after, now=now
    )


def audit_team_change(
    sender, *, team, action: str, before: dict, after: dict, actor, now: datetime, **_
) -> None:
    """A team's members, invitations, secrets (by name) or webhooks changed: ``action`` says which."""
    audit.record(actor=actor, action=action, target=f"team:{team.slug}", before=before, after=after, now=now)


def audit_rights(
    sender, *, kind: str, name: str, before: dict, after: dict, actor, now: datetime, **_
) -> None:
    """An account made an operator or superuser, given admin permissions or a group, or their loss ("user"); a
    group's permissions changed ("group"). ``after`` is {} for one deleted."""
    audit.record(
        actor=actor, action=f"{kind}.rights", target=f"{kind}:{name}", before=before, after=after, now=now
    )


def audit_account(sender, *, name: str, before: dict, after: dict, actor, now: datetime, **_) -> None:
    """How an account signs in changed in the admin: its name, e-mail or active flag, or its password."""
    audit.record(
        actor=actor, action="user.account", target=f"user:{name}", before=before, after=after, now=now
    )


def audit_team_rename(sender, *, team, before: dict, after: dict, actor, now: datetime, **_) -> None:
    audit.record(
        actor=actor, action="team.rename", target=f"team:{team.slug}", before=before, after=after, now=now
    )


def audit_unlock(sender, *, username: str, before: dict, actor, now: datetime, **_) -> None:
    """One (username, client address)'s count of failed sign-ins removed: its lockout, if any, lifted."""
    audit.record(
        actor=actor, action="user.unlock", target=f"user:{username}", before=before, after={}, now=now
    )


def audit_token_revoke(sender, *, name: str, before: dict, after: dict, actor, now: datetime, **_) -> None:
    audit.record(
        actor=actor, action="user.token-revoke", target=f"user:{name}", before=before, after=after, now=now
    )


def audit_partner_decline(sender, *, application_id: int, note: str, actor, now: datetime, **_) -> None:
    audit.record(
        actor=actor, action="partner.decline", target=f"application:{application_id}",
        before={"status": "pending"}, after={"status": "declined", "note": note}, now=now,
    )  # fmt: skip
