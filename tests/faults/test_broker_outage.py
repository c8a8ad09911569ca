"""The broker hangs for 30 s while 50 jobs are submitted through the API: every submission is answered
2xx at once and stored, and every job runs once the broker is back; none is lost.

The pool gets a Redis of its own (a free port, no persistence), so freezing it disturbs nobody
else's tests. SIGSTOP models the hard case: connections are accepted and then never answered.
"""

import os
import signal
import socket
import statistics
import subprocess
import time
from collections import Counter

import pytest
from django.test import Client

from accounts import services as accounts
from e31web.celery import app as celery_app
from jobs import dispatch
from jobs.models import Job
from tests.e2e.conftest import wait_for
from tests.faults.conftest import assert_settled

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.timeout(300)]
OUTAGE_S = 30
SUBMISSIONS = 50


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _point_celery_at(url: str) -> None:
    """This process publishes too (the API's enqueue after commit): drop its pooled connections."""
    celery_app.conf.broker_url = url
    celery_app._pool = None
    celery_app.amqp._producer_pool = None


@pytest.fixture
def own_redis(tmp_path, settings, monkeypatch):
    port = _free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    wait_for(
        lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).returncode == 0
    )
    previous = celery_app.conf.broker_url
    monkeypatch.setenv("CELERY_BROKER_URL", url)  # read by the pool's processes as they start
    settings.CELERY_BROKER_URL = url
    _point_celery_at(url)
    try:
        yield proc
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=10)
        _point_celery_at(previous)
        dispatch._quiet_until = 0.0  # the outage is over for the tests that follow


@pytest.fixture
def pool_on_own_redis(own_redis, live_pool):
    return live_pool


def _submission(n: int, output_root) -> dict:
    return {
        "name": f"outage-{n}", "work": {"argv": ["/usr/bin/true"]},
        "request": {"gpus": 1, "hours": 0.5}, "output": {"uri": f"file://{output_root}/outage-{n}", "bytes": 0},
    }  # fmt: skip


def test_fifty_submissions_during_a_30_s_broker_outage_are_all_answered_at_once_and_all_run(
    own_redis, pool_on_own_redis, member, settings
):
    _, token = accounts.create_api_token(user=member, label="outage")
    client = Client(headers={"Authorization": f"Bearer {token}"})
    answers, waits, ids = Counter(), [], []
    os.kill(own_redis.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        for n in range(SUBMISSIONS):
            began = time.monotonic()
            response = client.post(
                "/api/v1/jobs", _submission(n, settings.E31_OUTPUT_ROOTS[0] / "vision"), "application/json"
            )
            waits.append(time.monotonic() - began)
            answers[response.status_code] += 1
            ids.append(response.json().get("id"))
        submitted_in = time.monotonic() - stopped_at
        time.sleep(max(0.0, OUTAGE_S - submitted_in))
    finally:
        os.kill(own_redis.pid, signal.SIGCONT)
    back_at = time.monotonic()
    stored = Job.objects.filter(id__in=ids).count()
    wait_for(
        lambda: Job.objects.filter(id__in=ids, state="released").count() == SUBMISSIONS, timeout=150, every=0.5,
        what=f"all {SUBMISSIONS} jobs released (now {Counter(Job.objects.filter(id__in=ids).values_list('state', flat=True))})",
    )  # fmt: skip
    outcomes = Counter(Job.objects.filter(id__in=ids).values_list("end_reason", flat=True))
    lost = SUBMISSIONS - Job.objects.filter(id__in=ids, state="released").count()
    print(
        f"\nbroker outage: Redis stopped {OUTAGE_S} s; {SUBMISSIONS} submissions in {submitted_in:.1f} s, "
        f"answers {dict(answers)}, slowest {max(waits):.2f} s, median {statistics.median(waits):.3f} s, "
        f"{sum(w > 1 for w in waits)} over 1 s; {stored} stored; all released "
        f"{time.monotonic() - back_at:.0f} s after Redis returned; outcomes {dict(outcomes)}; {lost} lost"
    )
    assert answers == {201: SUBMISSIONS} and stored == SUBMISSIONS
    # One publish waits out the socket timeout (2 s, one retry); then the process leaves the broker
    # alone for E31_BROKER_QUIET_S and the other submissions are answered at once.
    assert max(waits) < 5.0, f"a submission waited {max(waits):.1f} s on the broker"
    assert sum(w > 1 for w in waits) <= 1 + submitted_in // settings.E31_BROKER_QUIET_S
    assert outcomes == {"succeeded": SUBMISSIONS}
    assert_settled(ids)


@pytest.mark.django_db
def test_after_a_refused_publish_the_process_leaves_the_broker_alone_for_a_moment(
    settings, monkeypatch, django_capture_on_commit_callbacks
):
    settings.E31_BROKER_QUIET_S = 60.0
    monkeypatch.setattr(dispatch, "_quiet_until", 0.0)
    sent = []

    def refused() -> None:
        sent.append("refused")
        raise ConnectionError("broker down")

    with django_capture_on_commit_callbacks(execute=True):
        dispatch.after_commit(refused, "first")
        dispatch.after_commit(lambda: sent.append("rang during the quiet minute"), "second")
    assert sent == ["refused"]
    dispatch._quiet_until = time.monotonic() - 1  # the quiet period is over
    with django_capture_on_commit_callbacks(execute=True):
        dispatch.after_commit(lambda: sent.append("sent"), "third")
    assert sent == ["refused", "sent"]
