"""A node's deliveries never hold its agent's worker threads: the next job rented there starts meanwhile.

The agent serves its queue with a thread per GPU and two spare. A delivery holds its thread for its whole copy
(hours for a large output) and while it waits for one of the node's delivery slots: on a 1-GPU node, the outputs
of three earlier jobs kept the next job's start waiting in the queue, the job RENTED, its GPU held and metered.
"""

import threading
import time
import uuid

import celery
import pytest
from celery.contrib.testing.worker import start_worker
from django.conf import settings as django_settings

import jobs.tasks  # noqa: F401 - registers the tasks on the app
from jobs import agent, delivery, delivery_threads, dispatch

pytestmark = [pytest.mark.timeout(120), pytest.mark.django_db(transaction=True)]


@pytest.fixture
def node_queue():
    if not django_settings.CELERY_BROKER_URL.startswith("redis://"):
        pytest.fail("needs the Redis broker (CELERY_BROKER_URL=redis://…; make test sets it)")
    queue = dispatch.node_queue(f"threads-{uuid.uuid4().hex[:8]}")
    yield queue
    with celery.current_app.connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)
        for key in conn.default_channel.client.keys(f"*{queue}*"):
            conn.default_channel.client.delete(key)


def test_a_part_rented_on_a_node_starts_while_the_nodes_earlier_outputs_are_delivered(
    monkeypatch, node_queue
):
    app, release = celery.current_app, threading.Event()
    delivering, started = [], []

    def large_delivery(*, allocation_id, now):  # 200 GB to the team's bucket: an hour or more
        delivering.append(allocation_id)
        release.wait(60)

    monkeypatch.setattr(delivery, "deliver_part", large_delivery)
    monkeypatch.setattr(agent, "run_part", lambda *, allocation_id, **_: started.append(allocation_id))
    try:
        with start_worker(
            app,
            pool="threads",
            concurrency=1 + 2,
            perform_ping_check=False,
            queues=[node_queue],
            without_heartbeat=True,
            shutdown_timeout=30,
        ):  # fmt: skip  (as node_agent starts it)
            for allocation_id in (101, 102, 103, 104):  # four earlier jobs' outputs, rung at their RELEASE
                app.send_task(dispatch.DELIVER_PART, args=(allocation_id,), queue=node_queue)
            deadline = time.monotonic() + 20
            while len(delivering) < 3 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert len(delivering) == 3  # as many at once as the node's slots, plus one waiting for a slot
            app.send_task(dispatch.RUN_PART, args=(105,), queue=node_queue)  # the job rented next on GPU 0
            deadline = time.monotonic() + 15
            while not started and time.monotonic() < deadline:
                time.sleep(0.1)
            assert started == [105], "the part waited behind the deliveries"
            release.set()
            deadline = time.monotonic() + 20
            while len(delivering) < 4 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert sorted(delivering) == [101, 102, 103, 104]  # nothing was dropped
    finally:
        release.set()


def test_a_part_rung_again_while_its_delivery_is_queued_or_running_is_not_delivered_twice_at_once(
    monkeypatch,
):
    """The reconciler rings an undelivered part every pass, for as long as its copy lasts."""
    release, calls = threading.Event(), []

    def slow_delivery(*, allocation_id, now):
        calls.append(allocation_id)
        release.wait(30)

    monkeypatch.setattr(delivery, "deliver_part", slow_delivery)
    try:
        assert delivery_threads.deliver_part(7)
        deadline = time.monotonic() + 10
        while not calls and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not delivery_threads.deliver_part(7)  # running: the ring is dropped
        assert delivery_threads.deliver_part(8)
    finally:
        release.set()
    deadline = time.monotonic() + 10
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(calls) == [7, 8]
