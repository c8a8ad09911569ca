"""Staging runs on a queue of its own: a copy that lasts an hour never holds a control thread.

A stage holds its worker thread for its whole copy, and while it waits for one of the pool's transfer slots.
On the control queue, served by a worker of 4 threads, four large datasets staging stopped every safety net
there: the reaper, the reconciler, the scheduler's passes, the meter's accrual, the notifications. A node that
died was not declared down, so its GPUs stayed held and metered, and no queued job started, until a copy ended.
"""

import threading
import time
import uuid

import celery
import pytest
from celery.contrib.testing.worker import start_worker
from django.conf import settings as django_settings
from django.db import transaction

import jobs.tasks  # noqa: F401 - registers the tasks on the app
from jobs import dispatch, nodes, staging

pytestmark = [pytest.mark.timeout(120), pytest.mark.django_db(transaction=True)]


def test_a_dead_node_is_still_reaped_while_four_large_datasets_stage(settings, monkeypatch):
    if not django_settings.CELERY_BROKER_URL.startswith("redis://"):
        pytest.fail("needs the Redis broker (CELERY_BROKER_URL=redis://…; make test sets it)")
    app = celery.current_app
    control = settings.CELERY_TASK_DEFAULT_QUEUE = f"control-{uuid.uuid4().hex[:8]}"
    release, staged, reaped = threading.Event(), [], []

    def large_stage(*, job_id, now):  # a 300 GB dataset at 100 MB/s holds its thread ~50 minutes
        staged.append(job_id)
        release.wait(60)

    monkeypatch.setattr(staging, "stage_job", large_stage)
    monkeypatch.setattr(nodes, "reap_silent_nodes", lambda *, now: reaped.append(time.monotonic()))
    beat = django_settings.CELERY_BEAT_SCHEDULE["reap-silent-nodes"]
    try:
        with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False, queues=[control],
                          without_heartbeat=True, shutdown_timeout=30):  # fmt: skip
            for job_id in range(1, 5):  # four submissions, each ringing for its staging after its commit
                with transaction.atomic():
                    dispatch.stage_job(job_id)
            app.send_task(beat["task"], queue=control, **beat["options"])  # beat's pass, as beat sends it
            deadline = time.monotonic() + 15
            while not reaped and time.monotonic() < deadline:
                time.sleep(0.1)
        assert reaped, "the reaper's pass waited behind the stages"
        assert staged == [], "the control worker took the stages"
        assert dispatch.staging_queue() == f"{control}.staging"
    finally:
        release.set()
        with app.connection_for_write() as conn:
            client = conn.default_channel.client
            for queue in (control, f"{control}.staging"):
                conn.default_channel.queue_delete(queue)
                for key in client.keys(f"*{queue}*"):
                    client.delete(key)
