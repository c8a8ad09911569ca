"""Rings the doorbell: enqueues work for other processes after the current transaction commits.

PostgreSQL holds the truth, so a lost or refused message only delays work: the reconciler finds
the job still waiting and rings again. That is also why a broker outage is logged, not raised:
a team's submission must commit even while the broker is down.

Tasks are sent by name, so no writer imports the Celery edges that call it (the edges import the
writers); the names are checked against the registered tasks by the tests.
"""

import logging
import time
from datetime import datetime

import celery
from django.conf import settings
from django.db import transaction

from jobs.models import SchedulerState

log = logging.getLogger(__name__)
# After a refused publish this process leaves the broker alone for E31_BROKER_QUIET_S: otherwise every
# request of an outage would wait out the broker's socket timeout again (50 submissions, 100 s).
_quiet_until = 0.0

STAGE_JOB = "jobs.tasks.stage_job"
RUN_REQUESTED_PASSES = "jobs.tasks.run_requested_passes"
RUN_PART = "jobs.tasks.run_part"
DELIVER_PART = "jobs.tasks.deliver_part"


def after_commit(send, what: str) -> None:
    def ring() -> None:
        global _quiet_until
        if time.monotonic() < _quiet_until:
            log.info("broker unreachable a moment ago: %s is left to the reconciler", what)
            return
        try:
            send()
        except Exception as exc:  # the broker is down or refused: the reconciler will re-drive it
            _quiet_until = time.monotonic() + settings.E31_BROKER_QUIET_S
            log.warning("could not enqueue %s (%s); the reconciler will retry", what, exc)

    transaction.on_commit(ring)


def send_after_commit(
    task_name: str,
    args: tuple,
    *,
    queue: str,
    expires_s: float | None = None,
    countdown_s: float | None = None,
) -> None:
    """Enqueues ``task_name(*args)`` on ``queue`` once the current transaction commits; a message given
    ``expires_s`` is dropped unread past it (a repeat the reconciler rings again anyway), one given ``countdown_s``
    is run no sooner than that after it is sent."""
    shown = f"{task_name.rsplit('.', 1)[-1]}({', '.join(map(str, args))})"
    options = {"expires": expires_s} if expires_s else {}
    if countdown_s:
        options["countdown"] = countdown_s
    after_commit(lambda: celery.current_app.send_task(task_name, args=args, queue=queue, **options), shown)


def stage_job(job_id: int, *, expires_s: float | None = None) -> None:
    send_after_commit(STAGE_JOB, (job_id,), queue=staging_queue(), expires_s=expires_s)


def restage_job(job_id: int, *, claim: datetime, countdown_s: float) -> None:
    """Stages a job again once ``countdown_s`` has passed, by the stager that takes its hand-over ``claim``: the
    ``worker_seen_at`` the stager that gave its thread back left on the job (``staging.stage_job``)."""
    send_after_commit(STAGE_JOB, (job_id, claim.isoformat()), queue=staging_queue(), countdown_s=countdown_s)


def request_scheduler_pass() -> None:
    """Asks for a scheduler pass; passes coalesce, so many requests cost one pass.

    The flag is raised once the asking transaction has committed, never inside it. A flag raised inside could be
    claimed by a pass that then read the pool before the change it was raised for (GPUs freed, a job queued) had
    committed, and no later pass was asked for it: the change waited for the safety pass. And the asking
    transaction held the pool's one flag row until it ended, so a long one (an array's cancel) held up every
    team's submissions, and lock orders around it could deadlock. Only the request that raises the flag rings;
    the pass lowers it before it plans.
    """
    pending = (func for _, func, _ in transaction.get_connection().run_on_commit)
    if _raise_flag not in pending:  # one per transaction: the same savepoints roll back each of its requests
        transaction.on_commit(_raise_flag, robust=True)  # a failure is logged; the safety pass follows anyway


def _raise_flag() -> None:
    state = state_row()
    if SchedulerState.objects.filter(id=state.id, pass_requested=False).update(pass_requested=True):
        send_after_commit(RUN_REQUESTED_PASSES, (), queue=control_queue())


def claim_requested_pass() -> bool:
    """Clears the flag before a pass, so requests made during it ring again."""
    return bool(SchedulerState.objects.filter(pass_requested=True).update(pass_requested=False))


def state_row() -> SchedulerState:
    """The one row that holds the pass-request flag and the last pass's figures (created on first use)."""
    state = SchedulerState.objects.first()
    return state or SchedulerState.objects.create()


def run_part(allocation_id: int, node_name: str) -> None:
    send_after_commit(RUN_PART, (allocation_id,), queue=node_queue(node_name))


def deliver_part(allocation_id: int, node_name: str) -> None:
    send_after_commit(DELIVER_PART, (allocation_id,), queue=node_queue(node_name))


def control_queue() -> str:
    return settings.CELERY_TASK_DEFAULT_QUEUE


def staging_queue() -> str:
    """Where data inputs are copied and images pulled, by workers of their own: a stage holds its thread for its
    whole copy (and while it waits for a transfer slot), and on the control queue four of them would stop the
    reaper, the reconciler, the scheduler's passes and the meter for as long as they last."""
    return f"{control_queue()}.staging"


def notify_queue() -> str:
    """Where webhooks and e-mails go out, by workers of their own: a try may wait E31_WEBHOOK_TIMEOUT_S on a
    team's receiver, and on the control queue one team's receiver that never answers would hold every control
    thread, and with them everyone's scheduler passes, the reaper and the meter."""
    return f"{control_queue()}.notify"


def queue_depth(queue: str) -> int:
    """Messages waiting on ``queue`` (0 where the broker has no such queue yet or cannot be asked)."""
    try:
        with celery.current_app.connection_for_read() as conn:
            return conn.default_channel.queue_declare(queue=queue, passive=True).message_count
    except Exception:  # no such queue, or the broker is down: nothing known to wait
        return 0


def node_queue(node_name: str) -> str:
    return f"node.{node_name}"
