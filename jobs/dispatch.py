"""Rings the doorbell: enqueues work for other processes after the current transaction commits.

PostgreSQL holds the truth, so a lost or refused message only delays work: the reconciler finds
the job still waiting and rings again. That is also why a broker outage is logged, not raised:
a team's submission must commit even while the broker is down.
"""

import logging
import time

from django.conf import settings
from django.db import transaction

log = logging.getLogger(__name__)
# After a refused publish this process leaves the broker alone for E31_BROKER_QUIET_S: otherwise every
# request of an outage would wait out the broker's socket timeout again (50 submissions, 100 s).
_quiet_until = 0.0


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


def stage_job(job_id: int) -> None:
    from jobs import tasks

    after_commit(
        lambda: tasks.stage_job.apply_async((job_id,), queue=control_queue()), f"stage_job({job_id})"
    )


def request_scheduler_pass() -> None:
    """Asks for a scheduler pass; passes coalesce, so many requests cost one pass."""
    from jobs import scheduler

    scheduler.mark_pass_requested()


def run_allocation(allocation_id: int, node_name: str) -> None:
    from jobs import tasks

    after_commit(
        lambda: tasks.run_allocation.apply_async((allocation_id,), queue=node_queue(node_name)),
        f"run_allocation({allocation_id})",
    )


def deliver_outputs(allocation_id: int, node_name: str) -> None:
    from jobs import tasks

    after_commit(
        lambda: tasks.deliver_outputs.apply_async((allocation_id,), queue=node_queue(node_name)),
        f"deliver_outputs({allocation_id})",
    )


def control_queue() -> str:
    return settings.CELERY_TASK_DEFAULT_QUEUE


def node_queue(node_name: str) -> str:
    return f"node.{node_name}"
