"""Keeps the embedded console's processes up: a child that exits is started again after a pause.

The pause doubles with each exit in a row (1 s, 2 s, 4 s … at most 30 s), so a child that cannot
start does not spin; one that ran a minute counts as healthy again. A start the system refuses (the
program gone after a ``uv sync``, a fork refused) counts as an exit. Every exit and restart is
logged and written to the health page's "console" probe. Only the console's own stop (Ctrl-C, TERM
or a hangup) stops the children for good.
"""

import logging
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

log = logging.getLogger(__name__)

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 60.0
STOP_GRACE_S = 10.0
PROBE = "console"  # the health page's row for the console (operations.models.HealthProbe)


def backoff_s(exits_in_a_row: int) -> float:
    return min(BACKOFF_MAX_S, BACKOFF_START_S * 2 ** max(0, exits_in_a_row - 1))


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


@dataclass
class Child:
    name: str
    command: list[str]
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    # The wall-clock start: the health page reads a report long after it was made.
    started_on: datetime | None = None
    restarts: int = 0
    exits_in_a_row: int = 0
    restart_at: float | None = None
    last_exit: str = ""
    history: list[str] = field(default_factory=list)

    @property
    def up(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Supervisor:
    """Starts the children, restarts those that exit, and stops them all when asked."""

    def __init__(self, commands: dict[str, list[str]], *, env: dict[str, str],
                 report: Callable[[list[Child]], None], clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 pass_fds: tuple[int, ...] = ()) -> None:  # fmt: skip
        self.children = [Child(name, command) for name, command in commands.items()]
        self.env, self.report, self.clock, self.wall = env, report, clock, wall
        self.pass_fds = pass_fds  # descriptors every child holds open too (the state folder's lock)

    def start_all(self) -> None:
        """Starts every child not started yet; one that cannot start waits its pause like an exit."""
        for child in self.children:
            if child.process is None and child.restart_at is None:
                self._start(child)
        self.report(self.children)

    def tick(self) -> None:
        """One look at every child: notes exits, starts those whose pause is over."""
        now, changed = self.clock(), False
        for child in self.children:
            if child.restart_at is None and child.process is not None and child.process.poll() is not None:
                self._exited(child, now)
                changed = True
            elif child.restart_at is not None and now >= child.restart_at:
                child.restarts += 1
                self._start(child)
                changed = True
        if changed:
            self.report(self.children)

    def stop_all(self) -> None:
        running = [c.process for c in self.children if c.up]
        for process in running:
            process.send_signal(signal.SIGTERM)
        deadline = self.clock() + STOP_GRACE_S
        for process in running:
            try:
                process.wait(timeout=max(0.1, deadline - self.clock()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _start(self, child: Child) -> None:
        now = self.clock()
        try:
            child.process = subprocess.Popen(child.command, env=self.env, pass_fds=self.pass_fds)
        except OSError as exc:  # raised here, it would end the supervisor and orphan the other children
            self._down(child, now, why=f"could not start: {exc}", stable=False)
            return
        child.started_at, child.started_on, child.restart_at = now, self.wall(), None
        level = logging.WARNING if child.restarts else logging.INFO
        log.log(level, "%s started (pid %d)", child.name, child.process.pid)

    def _exited(self, child: Child, now: float) -> None:
        ran = now - child.started_at
        why = f"{describe_exit(child.process.returncode)} after {ran:.0f} s"
        self._down(child, now, why=why, stable=ran >= STABLE_AFTER_S)

    def _down(self, child: Child, now: float, *, why: str, stable: bool) -> None:
        child.exits_in_a_row = 1 if stable else child.exits_in_a_row + 1
        pause = backoff_s(child.exits_in_a_row)
        child.last_exit, child.restart_at = why, now + pause
        child.history = [*child.history[-4:], why]
        log.error("%s %s; restarting in %g s (restart %d)", child.name, why, pause, child.restarts + 1)


def summary(children: list[Child], now: float) -> tuple[bool, str]:
    """Whether every child is up, then a first line for the health page and one line per child."""
    down = [c for c in children if not c.up]
    restarts = sum(c.restarts for c in children)
    if down:
        head = "; ".join(f"{c.name} down ({c.last_exit or 'not started'})" for c in down)
    else:
        head = f"all {len(children)} processes up"
    lines = [f"{head}; {restarts} restart{'' if restarts == 1 else 's'} since the console started"]
    for child in children:
        if child.up:
            # Since when, not for how long: the health page shows this report minutes after it was made.
            state = f"up since {child.started_on:%Y-%m-%d %H:%M:%S} UTC (pid {child.process.pid})"
        else:
            state = f"down, restarting in {max(0.0, (child.restart_at or now) - now):.0f} s"
        exits = f"; exits: {', '.join(child.history)}" if child.history else ""
        lines.append(
            f"{child.name}: {state}, restarted {child.restarts} time{'' if child.restarts == 1 else 's'}{exits}"
        )
    return not down, "\n".join(lines)
