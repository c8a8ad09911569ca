"""The audit log of operator actions: append-only, one entry per action that changed something.

Call ``record`` inside the action's own transaction, so an entry commits with its action or not
at all: the log never claims an action that rolled back, and never misses one that committed.
"""

from datetime import datetime
from typing import Any

from operations.models import AuditEntry


def record(*, actor: Any, action: str, target: str, before: dict, after: dict, now: datetime) -> AuditEntry:
    """Appends who did ``action`` to ``target`` at ``now``, with the target's state before and after.

    ``actor`` is a user (its id and username are copied) or a plain name such as "system".
    """
    username = getattr(actor, "get_username", lambda: str(actor))() or "system"
    return AuditEntry.objects.create(
        actor_user_id=getattr(actor, "pk", None),
        actor=username[:150],
        action=action[:40],
        target=target[:200],
        before=before,
        after=after,
        at=now,
    )
