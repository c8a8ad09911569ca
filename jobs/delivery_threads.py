"""A node's deliveries run on threads of their own, never on its agent's worker threads.

The agent serves its queue with a thread per GPU and two spare. A delivery holds its thread for its whole copy
(hours for a large output) and while it waits for one of the node's delivery slots, so on the worker threads a
few large outputs kept the next job's start waiting in the queue, its GPUs held and metered. The message is
acknowledged once handed over: the delivery's state is in the database, and the reconciler rings a part again
while it is undelivered (a ring for a part already queued or running here is dropped).
"""

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import connection

from jobs import clock, delivery

log = logging.getLogger(__name__)
_lock = threading.Lock()
_pending: set[int] = set()  # parts queued or being delivered by this process
_executor: ThreadPoolExecutor | None = None


def deliver_part(allocation_id: int) -> bool:
    """Delivers the part's outputs on a delivery thread; False if this process has it queued or running already."""
    global _executor
    with _lock:
        if allocation_id in _pending:
            return False
        _pending.add(allocation_id)
        if _executor is None:
            # One thread per delivery slot of the node, one more for a delivery waiting for a slot.
            workers = settings.E31_DELIVERY_CONCURRENCY + 1
            _executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="delivery")
        _executor.submit(_deliver, allocation_id)
    return True


def _deliver(allocation_id: int) -> None:
    try:
        # The platform's time, as every date the agent writes: the lease it judges was written in it.
        delivery.deliver_part(allocation_id=allocation_id, now=clock.now())
    except Exception:  # the part stays undelivered: the reconciler rings it again
        log.exception("delivery of allocation %s failed; it will be tried again", allocation_id)
    finally:
        connection.close()  # a thread of our own: nothing else closes its database connection
        with _lock:
            _pending.discard(allocation_id)
