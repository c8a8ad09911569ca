"""PostgreSQL restarts under running jobs; two beats run at once: the pool recovers by itself and
the ledger never holds a period twice."""

import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import DatabaseError, connection, connections
from django.utils import timezone

from jobs import rental
from jobs.lifecycle import EndReason
from jobs.models import Allocation, Job, Node
from metering.models import MeterEntry
from tests.e2e.conftest import wait_for, wait_for_state
from tests.factories import JobFactory, NodeFactory
from tests.faults.conftest import assert_settled, attempts_watched, duplicate_ledger_rows, py, submit

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.timeout(240)]


def restart_postgresql() -> float:
    """The cluster holding the test database, restarted as an operator would; returns the seconds it took."""
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[0]
    began = time.monotonic()
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"], check=True, timeout=120
    )
    connections.close_all()  # this process's own connection died with the server
    return time.monotonic() - began


def test_a_postgresql_restart_while_jobs_run_is_survived_with_no_manual_step(live_pool, member):
    jobs = [
        submit(member, py("import time; time.sleep(6); print('done')"), requeue=True, name=f"pg-{i}").id
        for i in range(4)
    ]
    with attempts_watched() as doubled:
        for job_id in jobs:
            wait_for_state(job_id, "running", timeout=60)
        took = restart_postgresql()
        restarted_at = timezone.now()
        finished = [wait_for_state(job_id, "released", timeout=120) for job_id in jobs]
    # Every agent beats again on its own; a node declared down by a reaper that woke first has registered again.
    wait_for(
        lambda: Node.objects.filter(name__in=live_pool.nodes, state="up", last_heartbeat__gt=restarted_at).count()
        == len(live_pool.nodes),
        timeout=30, what="every node up and beating after the restart",
    )  # fmt: skip
    alive = [name for name, proc in live_pool.procs.items() if proc.poll() is None]
    lost = Allocation.objects.filter(job_id__in=jobs, attempt=1).exclude(job__attempt=1).count()
    print(
        f"\nPostgreSQL restart: 1 trial, {took:.1f} s down; {len(jobs)} running jobs ended "
        f"{[(j.end_reason, j.attempt) for j in finished]} ({lost} first attempts lost and requeued); "
        f"processes alive {sorted(alive)}"
    )
    assert sorted(alive) == sorted(live_pool.procs), "a process of the pool died with the database"
    assert [j.end_reason for j in finished] == ["succeeded"] * len(jobs)
    assert doubled == []
    assert_settled(jobs)


def _running_since(node: Node, *, hours_ago: float, n: int, first_gpu: int = 0) -> list[int]:
    """Jobs held on ``node`` since hours ago, on GPUs ``first_gpu``, ``first_gpu`` + 1, ... (one job a GPU, as
    RENT holds them): each accrual has whole hours to close for them."""
    at = timezone.now() - timedelta(hours=hours_ago)
    ids = []
    for i in range(n):
        job = JobFactory(team=node_team(), name=f"held-{hours_ago}-{i}", state="running", attempt=1,
                         submitted_at=at, state_changed_at=at, worker_seen_at=timezone.now())  # fmt: skip
        Allocation.objects.create(job=job, attempt=1, node=node, gpu_indices=[first_gpu + i], rented_at=at,
                                  started_at=at)  # fmt: skip
        ids.append(job.id)
    return ids


def node_team():
    from accounts.models import Team

    return Team.objects.get_or_create(name="ledger", slug="ledger")[0]


def _keep_alive(node: Node, stop: threading.Event) -> None:
    """Plays the agent of a node with no process: heartbeats and 'still running' signs, so neither the
    reaper nor the reconciler releases its jobs while the two beats accrue them."""
    try:
        while not stop.wait(0.3):
            now = timezone.now()
            Node.objects.filter(id=node.id).update(last_heartbeat=now)
            Job.objects.filter(allocations__node=node, state="running").update(worker_seen_at=now)
    except DatabaseError:
        pass
    finally:
        connection.close()


def test_two_beats_at_once_for_several_accrual_periods_write_no_period_twice(live_pool, settings):
    state = Path(live_pool.env["E31_STATE_DIR"])
    live_pool.procs["beat"].terminate()  # replaced by two that log each send, so both are seen at work
    live_pool.procs["beat"].wait(timeout=10)
    for beat in ("beat", "beat2"):
        live_pool.start(beat, [sys.executable, "-m", "celery", "-A", "e31web", "beat", "--loglevel", "INFO",
                               "--schedule", str(state / f"{beat}-own-schedule")])  # fmt: skip
    for beat in ("beat", "beat2"):
        wait_for(lambda b=beat: "Starting..." in live_pool.log(b), timeout=30, what=f"{beat} to start")
    node = NodeFactory(name=f"ledger-{live_pool.tag}", gpus=20)
    stop = threading.Event()
    beating = threading.Thread(target=_keep_alive, args=(node, stop), daemon=True)
    beating.start()
    held: list[int] = []
    try:
        for wave in range(5):  # each wave's first accrual is raced by both beats' tasks
            held += _running_since(node, hours_ago=2.5 + wave, n=4, first_gpu=4 * wave)
            time.sleep(float(live_pool.env["E31_ACCRUE_EVERY_S"]))
        wait_for(lambda: MeterEntry.objects.filter(job_id__in=held).count() >= sum(range(2, 7)) * 4, timeout=20,
                 what="every completed hour accrued")  # fmt: skip
    finally:
        stop.set()
        beating.join(timeout=5)
    for job_id in held:  # RELEASE closes each meter's last, partial hour
        rental.release_job(job_id=job_id, end_reason=EndReason.SUCCEEDED, now=timezone.now(), actor="test")
    sent = [live_pool.log(b).count("Sending due task accrue-meter-hourly") for b in ("beat", "beat2")]
    print(
        f"\ntwo beats: {sent} accrual sends by beat 1 and beat 2, "
        f"{len(held)} allocations held 2.5-6.5 h, {MeterEntry.objects.filter(job_id__in=held).count()} ledger rows, "
        f"{len(duplicate_ledger_rows())} periods twice"
    )
    assert min(sent) >= 4, sent
    assert_settled(held)
