"""What operations does when metering speaks (connected in ``OperationsConfig.ready``).

Metering sends its signals without importing operations; these receivers are the other end.
"""

from datetime import datetime

from operations import audit


def audit_budget(sender, *, team, before: dict, after: dict, operator, now: datetime, **_) -> None:
    audit.record(
        actor=operator, action="team.budget", target=f"team:{team.slug}", before=before, after=after, now=now
    )


def audit_membership(
    sender, *, team, action: str, before: dict, after: dict, actor, now: datetime, **_
) -> None:
    audit.record(actor=actor, action=action, target=f"team:{team.slug}", before=before, after=after, now=now)
