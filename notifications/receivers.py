"""Listens to jobs' events and to changes of a team's members (neither jobs nor accounts imports this app)."""

from datetime import datetime

from django.dispatch import receiver

from accounts import selectors
from accounts import signals as accounts_signals
from jobs import signals
from notifications import services


@receiver(signals.job_event)
def record_job_event(
    sender, *, job_id: int, event: str, attempt: int, now: datetime, detail: str = "", **_
) -> None:
    services.record_job_event(job_id=job_id, event=event, attempt=attempt, now=now, detail=detail)


@receiver(accounts_signals.membership_changed)
def remove_a_former_admins_webhooks(
    sender, *, team, action: str, before: dict, after: dict, actor, now: datetime, **_
) -> None:
    """An admin removed from the team, or made a member, takes the webhooks they added with them."""
    was_admin = before.get("role") == "admin"
    if (
        not was_admin
        or action not in {"team.member-remove", "team.member-role"}
        or after.get("role") == "admin"
    ):
        return
    user_id = selectors.user_id_named(before["member"])  # the signal names the member as the audit log does
    if user_id is not None:
        services.remove_webhooks_added_by(team=team, user_id=user_id, actor=actor, now=now)
