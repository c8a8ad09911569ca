"""The one way a job's state moves: a conditional UPDATE and its event row, in one transaction.

Every writer that changes a job's state (intake, staging, rental) calls ``transition``; a second
worker, or a redelivered task, finds the state already moved and gets False back.
"""

from collections.abc import Iterable
from datetime import datetime

from django.db import transaction

from common import nul
from jobs import signals
from jobs.lifecycle import TERMINAL, State, check_transition, notice_for
from jobs.models import Job, JobEvent


def transition(
    *, job_id: int, source: State | Iterable[State], target: State, now: datetime,
    reason: str = "", actor: str = "", end_reason: str = "", via: str = "", **fields,
) -> bool:  # fmt: skip
    """Moves a job from one of ``source`` to ``target`` if it is still there; logs the event.

    ``via`` names a non-ending cause the table checks (REQUEUED, PREEMPTED) when ``reason`` is prose.
    """
    sources = [State(source)] if isinstance(source, str) else [State(s) for s in source]
    # A reason often quotes another party (a server's answer): PostgreSQL would refuse its NUL, and the change.
    reason = nul.shown(reason)
    fields = {name: nul.shown(value) if isinstance(value, str) else value for name, value in fields.items()}
    if target in TERMINAL:  # an ended job waits for nothing: its last wait must not be shown as current
        fields = {"pending_reason": "", "estimated_start": None, **fields}
    for s in sources:
        check_transition(s, target, end_reason or via or reason)
    with transaction.atomic():
        job = Job.objects.filter(id=job_id, state__in=sources).values("state", "attempt").first()
        if job is None:
            return False
        claimed = Job.objects.filter(id=job_id, state=job["state"]).update(
            state=target, state_changed_at=now, end_reason=end_reason, **fields
        )
        if claimed:
            JobEvent.objects.create(
                job_id=job_id, from_state=job["state"], to_state=target, at=now,
                reason=(reason or end_reason)[:300], actor=actor[:150], attempt=fields.get("attempt", job["attempt"]),
            )  # fmt: skip
            if event := notice_for(target, end_reason):
                signals.job_event.send(
                    sender=Job, job_id=job_id, event=event, attempt=fields.get("attempt", job["attempt"]), now=now,
                    detail=(reason or end_reason)[:300],
                )  # fmt: skip
        return bool(claimed)
