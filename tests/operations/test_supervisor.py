"""The embedded console's supervisor: a child that exits comes back after a growing pause (issue 15)."""

import signal
import sys
from datetime import UTC, datetime

import pytest
from django.urls import reverse

from operations import health, services, supervisor
from operations.management.commands import run_console

EXITS = [sys.executable, "-c", "import sys; sys.exit(3)"]
SLEEPS = [sys.executable, "-c", "import time; time.sleep(60)"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def wait_exit(child: supervisor.Child) -> None:
    child.process.wait(timeout=30)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def reports():
    return []


@pytest.fixture
def console(clock, reports):
    console = supervisor.Supervisor(
        {"flaky": EXITS, "steady": SLEEPS}, env={}, report=reports.append, clock=clock
    )
    console.start_all()
    yield console
    console.stop_all()


def test_a_child_that_exits_is_restarted_after_a_pause_that_doubles(console, clock):
    flaky, steady = console.children
    first = flaky.process.pid
    wait_exit(flaky)
    console.tick()
    assert (flaky.restarts, flaky.restart_at, flaky.last_exit) == (0, 1001.0, "exited with code 3 after 0 s")
    clock.now = 1000.5
    console.tick()
    assert flaky.restarts == 0 and not flaky.up  # still pausing
    clock.now = 1001.0
    console.tick()
    assert flaky.restarts == 1 and flaky.process.pid != first
    wait_exit(flaky)
    console.tick()
    assert flaky.restart_at == 1003.0  # the second exit in a row waits 2 s
    assert steady.up and steady.restarts == 0


def test_the_pause_is_capped_and_a_child_that_ran_a_minute_starts_over(console, clock):
    assert supervisor.backoff_s(1) == 1 and supervisor.backoff_s(4) == 8 and supervisor.backoff_s(20) == 30
    flaky = console.children[0]
    flaky.exits_in_a_row = 5
    clock.now += supervisor.STABLE_AFTER_S
    wait_exit(flaky)
    console.tick()
    assert flaky.exits_in_a_row == 1 and flaky.restart_at == clock.now + 1


def test_stop_all_ends_every_child_and_restarts_none(console, clock):
    console.stop_all()
    clock.now += 100
    console.tick()
    console.tick()
    assert not any(c.up for c in console.children)
    assert all(c.restarts == 0 for c in console.children)


def test_each_exit_and_restart_is_reported_for_the_health_page(console, clock, reports):
    flaky = console.children[0]
    wait_exit(flaky)
    console.tick()
    ok, detail = supervisor.summary(reports[-1], clock.now)
    assert not ok and detail.startswith("flaky down (exited with code 3 after 0 s); 0 restarts")
    clock.now += 1
    console.tick()
    ok, detail = supervisor.summary(reports[-1], clock.now)
    assert "flaky: up since " in detail and "restarted 1 time; exits: exited with code 3 after 0 s" in detail


def test_the_health_page_says_since_when_each_child_is_up_not_a_duration_frozen_when_it_was_reported(
    clock, reports
):
    """The console reports its children when one starts or exits, and the health page reads that report
    minutes later: "up 0 s" would still be shown then. It says since when instead, in UTC."""
    started = datetime(2026, 12, 5, 21, 51, 26, tzinfo=UTC)
    console = supervisor.Supervisor(
        {"steady": SLEEPS}, env={}, report=reports.append, clock=clock, wall=lambda: started
    )
    console.start_all()
    try:
        clock.now += 300
        ok, detail = supervisor.summary(reports[-1], clock.now)
    finally:
        console.stop_all()
    assert (
        ok and f"steady: up since 2026-12-05 21:51:26 UTC (pid {console.children[0].process.pid})" in detail
    )


def test_a_child_that_cannot_be_started_again_neither_kills_the_console_nor_orphans_the_others(
    tmp_path, monkeypatch
):
    """An operator's `make run`: a local node agent exits, and by the time its pause is over it cannot be
    started (its executable is gone: `uv sync` replaced the venv; or fork fails with EAGAIN under a pids
    limit). The console logs the failed start, counts it as an exit, backs off and keeps supervising; and
    whatever ends it stops its children, which would otherwise run on holding the state folder's lock."""
    program = tmp_path / "flaky-agent"
    program.write_text("#!/bin/sh\nexit 3\n")
    program.chmod(0o755)
    clock = Clock()
    console = supervisor.Supervisor(
        {"flaky": [str(program)], "steady": SLEEPS}, env={}, report=lambda children: None, clock=clock
    )
    console.start_all()
    flaky, steady = console.children
    flaky.process.wait(timeout=30)
    program.unlink()  # cannot be started again

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    naps = 0

    def nap(_seconds: float) -> None:
        nonlocal naps
        naps += 1
        clock.now += 1.0
        if naps == 40:  # 40 s later the operator presses Ctrl-C
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)

    monkeypatch.setattr(run_console.time, "sleep", nap)
    raised = None
    try:
        run_console._supervise(console)
    except Exception as exc:  # what the console died of is the finding
        raised = exc
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        orphaned = steady.up
        if steady.up:
            steady.process.kill()
            steady.process.wait()
    assert raised is None, f"the supervisor died on {raised!r}"
    assert not orphaned, "the other children were left running without their supervisor"
    assert flaky.last_exit.startswith("could not start: ") and flaky.restarts > 1  # and it kept trying
    ok, detail = supervisor.summary(console.children, clock.now)
    assert not ok and detail.startswith("flaky down (could not start: ")


@pytest.mark.django_db
def test_the_health_page_shows_the_console_s_processes(operator_client, now):
    services.record_probe(name=supervisor.PROBE, ok=False, now=now,
                          detail="local-1 down (killed by SIGKILL after 40 s); 1 restart\nlocal-1: down, restarting in 1 s")  # fmt: skip
    [check] = [c for c in health.run_all(now=now) if c.key == "console"]
    assert not check.ok and check.summary.startswith("local-1 down (killed by SIGKILL after 40 s)")
    page = operator_client.get(reverse("operations:health")).content.decode()
    assert "Console processes" in page and "local-1: down, restarting in 1 s" in page


@pytest.mark.django_db
def test_without_a_console_there_is_no_console_check(now):
    assert "console" not in {c.key for c in health.run_all(now=now)}
