"""What a change of who may act for a team does to its jobs: a member removed from a team has its jobs there that
hold no GPUs yet cancelled, in the removal's own transaction, and an account deleted has all of its live jobs
cancelled, running ones too.

Else they would start later, behind a long queue or their prerequisites, with the team's secrets (rotated since,
perhaps) and on its budget. A removed member's jobs already running are left to the team's admins, who may cancel
them. The node agent checks the submitter again at each start (``accounts.team_secrets.check_submitter``): that also
covers an account deactivated, and a job placed while the removal committed.

Connected in ``JobsConfig.ready``: accounts signals the change and imports nothing of jobs.
"""

from datetime import datetime

from django.utils import timezone

from accounts import selectors
from jobs import services

MEMBER_REMOVED = "team.member-remove"


def cancel_removed_members_jobs(
    sender, *, team, action: str, before: dict, actor, now: datetime, **_
) -> None:
    """``accounts.signals.membership_changed``: a member removed takes its jobs in the team that have not started."""
    if action != MEMBER_REMOVED:
        return
    member = before["member"]
    user_id = selectors.user_id_named(member)  # the signal names the member as the audit log does
    if user_id is None:
        return
    left = getattr(actor, "pk", None) == user_id
    why = f"{member} left team {team.name}" if left else f"{member} was removed from team {team.name}"
    services.cancel_unstarted_jobs(submitted_by_id=user_id, team_id=team.id, why=why, actor=actor, now=now)


def cancel_deleted_accounts_jobs(sender, *, instance, **_) -> None:
    """``pre_delete`` of an account, inside the deletion's transaction: its jobs would keep no submitter (the column
    is set NULL), like a job the platform made itself, which the start's check lets through; its running ones too,
    as a node lost would requeue them."""
    services.cancel_deleted_accounts_jobs(
        submitted_by_id=instance.pk,
        why=f"the account {instance.get_username()} was deleted",
        now=timezone.now(),
    )
