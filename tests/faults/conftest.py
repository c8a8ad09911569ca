"""The fault suite's pool, helpers and invariants.

The pool is the e2e one (a real control worker, beat and two node agents on Redis, timeouts
compressed to seconds). After every fault test, with the pool stopped, `check_ledger` must find
0 violations and no metered period may be written twice.
"""

import io
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection
from django.db.models import Count
from django.utils import timezone

from jobs import declaration, services
from jobs.models import Allocation, GpuHold, Job
from metering import services as meter
from metering.models import MeterEntry
from tests.e2e.conftest import LivePool, wait_for
from tests.e2e.conftest import live_pool as live_pool  # re-exported: the fault tests' pool
from tests.factories import MembershipFactory, TeamFactory, UserFactory


@pytest.fixture(autouse=True)
def _ledger_checked_after(request) -> Iterator[None]:
    """Set up before the pool, so it runs after the pool has stopped: every meter must be closed."""
    if "live_pool" not in request.fixturenames:
        yield
        return
    request.getfixturevalue("transactional_db")
    yield
    assert_ledger_sound()


def assert_ledger_sound() -> None:
    """check_ledger, run as an operator runs it, finds 0 violations, and no period is written twice.

    Its exit code 1 on a violation is a SystemExit, which pytest lets out of a teardown unlike an assertion: the
    teardowns left (the database's flush, monkeypatch's undo) would be skipped, and every later test would meet
    this one's rows and patches. So the exit is caught here, and the report itself is what fails."""
    out = io.StringIO()
    with suppress(SystemExit):
        call_command("check_ledger", stdout=out)
    lines = out.getvalue().strip().splitlines()
    print(f"check_ledger after the test: {lines[-1]}")
    assert lines[-1] == "0 violations", "\n".join(lines)
    assert duplicate_ledger_rows() == []


@pytest.fixture
def member(live_pool):
    return MembershipFactory(
        team=TeamFactory(name="vision", slug="vision"), user=UserFactory(username="alice")
    ).user


def submit(
    member,
    argv: list[str],
    *,
    gpus: int = 1,
    requeue: bool = False,
    name: str = "fault",
    data=(),
    output_bytes: int = 1000,
) -> Job:
    from django.conf import settings

    team = member.memberships.first().team
    spec = declaration.validate(
        {
            "name": name, "work": {"argv": argv}, "data": list(data),
            "request": {"gpus": gpus, "hours": 1.0, "requeue": requeue},
            "output": {"uri": f"file://{settings.E31_OUTPUT_ROOTS[0]}/{team.slug}/{name}", "bytes": output_bytes},
        },
        limits=services.pool_limits(team=team),
    )  # fmt: skip
    return services.submit_job(team=team, user=member, spec=spec, now=timezone.now())


def py(code: str) -> list[str]:
    return ["/usr/bin/python3", "-c", code]


def start_worker(pool: LivePool) -> None:
    """The control worker, started as the live pool starts it (after a SIGKILL, under the same name)."""
    tag, queue = pool.tag, pool.env["E31_CONTROL_QUEUE"]
    queues = f"{queue},{queue}.staging"  # the control and staging queues, served apart in deployments
    pool.start("worker", [
        sys.executable, "-m", "celery", "-A", "e31web", "worker", "-Q", queues, "--pool", "threads", "-c", "4",
        "-n", f"control-{tag}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
    ])  # fmt: skip


def wait_until_registered(node: str, *, after) -> None:
    from jobs.models import Node

    wait_for(
        lambda: Node.objects.filter(name=node, state="up", registered_at__gt=after).exists(),
        timeout=90, what=f"{node}'s agent to register again",
    )  # fmt: skip


def overlapping_attempts(job_ids) -> list[str]:
    """Two attempts of one job holding GPUs at the same time, from the Allocation rows."""
    problems = []
    for job_id in job_ids:
        rows = list(Allocation.objects.filter(job_id=job_id).order_by("rented_at"))
        for a in rows:
            for b in rows:
                a_end = a.released_at or timezone.now()
                if a.attempt < b.attempt and b.rented_at < a_end:
                    problems.append(
                        f"job {job_id}: attempt {b.attempt} rented before attempt {a.attempt} released"
                    )
    return problems


def duplicate_ledger_rows() -> list[tuple]:
    return list(
        MeterEntry.objects.exclude(kind="adjustment").values("allocation_id", "period_start")
        .annotate(n=Count("id")).filter(n__gt=1).values_list("allocation_id", "period_start", "n")
    )  # fmt: skip


def assert_settled(job_ids) -> None:
    """Every attempt released with its GPUs freed, no two attempts overlapped, every meter closed."""
    assert not Allocation.objects.filter(job_id__in=job_ids, released_at__isnull=True).exists()
    assert not GpuHold.objects.filter(allocation__job_id__in=job_ids, active=True).exists()
    assert overlapping_attempts(job_ids) == []
    assert meter.find_violations(now=timezone.now()) == []
    assert duplicate_ledger_rows() == []


@contextmanager
def attempts_watched(every: float = 0.05) -> Iterator[list[str]]:
    """Samples the live rows while a fault runs: no job may ever hold two unreleased attempts.

    On leaving, the watcher must have run throughout: stopped when told, died of nothing, and answered at
    least one sample a second of the span watched (it tries twenty; a database restarting skips a few)."""
    seen: list[str] = []
    samples, failures = [0], []
    stop = threading.Event()

    def sample() -> None:
        try:
            while not stop.wait(every):
                try:
                    doubled = (
                        Allocation.objects.filter(released_at__isnull=True).values("job_id")
                        .annotate(n=Count("attempt", distinct=True)).filter(n__gt=1)
                    )  # fmt: skip
                    seen.extend(
                        f"job {r['job_id']} held {r['n']} attempts at {time.time():.2f}" for r in doubled
                    )
                    samples[0] += 1
                except DatabaseError:  # the database restarting under a fault: sample again next time
                    connection.close()
        except Exception as exc:  # kept for the test: a watcher that died watched nothing
            failures.append(exc)
        finally:
            connection.close()  # a thread's connection left open would block the test database's flush

    began = time.monotonic()
    thread = threading.Thread(target=sample, name="attempt-watcher", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(timeout=10)
    span = time.monotonic() - began
    assert not thread.is_alive(), "the attempt watcher did not stop within 10 s"
    assert failures == [], f"the attempt watcher died: {failures[0]!r}"
    assert samples[0] >= span, f"the attempt watcher answered {samples[0]} samples in {span:.1f} s"
