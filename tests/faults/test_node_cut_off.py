"""A node cut off from the database stops its jobs before the platform can give their GPUs to another attempt.

The platform declares a silent node lost E31_NODE_TIMEOUT_S after its last heartbeat and requeues its jobs;
a part that ran on through that (its agent unable to reach the database, its node otherwise fine) would run
beside the job's next attempt: two attempts at once, both writing the same checkpoint, one never metered.
"""

import socket
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest
from django.db import OperationalError, connections
from django.utils import timezone

from jobs import agent, rental
from jobs.lifecycle import EndReason, State
from jobs.models import Allocation, Job
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def compressed(settings):
    """Declared lost after 8 s of silence, a beat every 0.5 s, 1 s to die at TERM (checks every second)."""
    settings.E31_NODE_TIMEOUT_S, settings.E31_HEARTBEAT_S, settings.E31_KILL_GRACE_S = 8.0, 0.5, 1.0


def _cut_off(*args, **kwargs):
    raise OperationalError("could not connect to server: Connection timed out")


def _watched(monkeypatch, check) -> tuple[str, float]:
    """Watches a 20-second process with ``check`` standing in for the database checks; (reason, seconds)."""
    monkeypatch.setattr(agent, "_check", check)
    proc = subprocess.Popen(["sleep", "20"])
    watcher = agent.Watcher(None, None)
    try:
        began = time.monotonic()
        watcher.start()
        return agent._watch(proc, watcher), time.monotonic() - began
    finally:
        watcher.finish()
        proc.kill()
        proc.wait()


def test_a_part_cut_off_from_the_database_stops_before_its_node_can_be_declared_lost(compressed, monkeypatch):
    # Declared lost 8 s after its last beat, which may precede the last good check by 0.5 s; a good check is up
    # to 1 s old, and stopping takes up to 1 s more.
    assert agent.fence_after_s() == pytest.approx(5.5)
    reason, took = _watched(monkeypatch, _cut_off)
    assert reason == agent.FENCED, "it ran on although its node could be declared lost and its GPUs rented"
    assert 5.5 <= took and took + 1.0 <= 8.0 - 0.5


def test_a_database_restart_shorter_than_the_fence_does_not_stop_the_part(compressed, monkeypatch):
    """Out of reach for 2 s, then back: the part runs on (and is stopped here by its own end)."""
    down_until = time.monotonic() + 2.0
    checks = []

    def restarting(*args, **kwargs):
        checks.append(time.monotonic())
        if time.monotonic() < down_until:
            raise OperationalError("the database system is starting up")
        return "cancelled" if len(checks) > 4 else ""

    reason, _took = _watched(monkeypatch, restarting)
    assert reason == "cancelled"  # the checks went on after the restart: the fence never fired


def test_a_fenced_part_whose_node_was_not_declared_lost_requeues_its_job(pool, team):
    """The database came back before the reaper declared the node lost: the part the agent stopped is released as
    lost to its node, not as the job's failure, and the job goes back to the queue for its next attempt."""
    job = JobFactory(team=team, gpus=1, requeue=True)
    now = timezone.now()
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=now)
    part = Allocation.objects.get(job=job)
    assert rental.start_allocation(allocation_id=part.id, now=now)
    part.refresh_from_db()
    seen = SimpleNamespace(
        job=Job.objects.get(id=job.id), allocation=part, rank=0, num_nodes=1, node=part.node
    )

    agent._after_exit(seen, None, agent.FENCED, -15)

    job.refresh_from_db()
    part.refresh_from_db()
    assert (job.state, job.attempt, job.lost_attempts) == (State.QUEUED, 1, 1)
    assert part.released_at is not None and part.end_reason == EndReason.NODE_LOST
    assert job.events.filter(reason__contains="could not reach the platform").exists()


class _Partition:
    """A TCP relay to the real PostgreSQL that, once ``cut``, forwards nothing either way and answers no new
    connection: what a node sees when the network between it and the database drops its packets."""

    def __init__(self, host: str, port: int) -> None:
        self.cut = threading.Event()
        self.closed = threading.Event()
        self._upstream = (host, port)
        self._sockets: list[socket.socket] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self._sockets.append(client)
            if self.cut.is_set():
                continue  # accepted by the kernel, never answered
            upstream = socket.create_connection(self._upstream)
            self._sockets.append(upstream)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(0.05)
        while not self.closed.is_set():
            if self.cut.is_set():
                time.sleep(0.05)
                continue
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            dst.sendall(data)

    def close(self) -> None:
        self.closed.set()
        for s in [self._server, *self._sockets]:
            try:
                s.close()
            except OSError:
                pass


def test_a_part_whose_database_stops_answering_is_fenced_before_its_node_can_be_declared_lost(
    compressed, monkeypatch
):
    """A partition gives no error: the query waits on a connection whose peer never answers (the kernel's TCP
    timeout, minutes). The check waits on the watcher's thread; the watch judges the fence from the last check
    that went through. Through a relay to the real PostgreSQL, on a connection of the agent's own settings."""
    default = connections["default"].settings_dict
    partition = _Partition(default["HOST"] or "127.0.0.1", int(default["PORT"] or 5432))
    relayed = {**default, "HOST": "127.0.0.1", "PORT": str(partition.port)}
    held: dict = {}
    answered: list[float] = []

    def check(*args, **kwargs) -> str:  # what _check does: queries on the agent's connection
        wrapper = held.setdefault("wrapper", connections["default"].__class__(relayed, alias="cut"))
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT 1")
        answered.append(time.monotonic())
        return ""

    monkeypatch.setattr(agent, "_check", check)
    proc = subprocess.Popen(["sleep", "60"])
    watcher = agent.Watcher(None, None)
    watcher.start()
    try:
        time.sleep(1.5)  # a few good checks
        assert answered, "the checks went through before the cut"
        partition.cut.set()
        cut = time.monotonic()
        reason = agent._watch(proc, watcher)
        # Lost 8 s after its last beat (at most 0.5 s before the cut); stopping takes up to 1 s more.
        fenced_after = time.monotonic() - cut
        print(f"\nfenced {fenced_after:.2f} s after the cut (fence {agent.fence_after_s():.1f} s)")
        assert reason == agent.FENCED and fenced_after <= 8.0 - 0.5 - 1.0
    finally:
        partition.close()  # the waiting query now fails, and the watcher ends
        watcher.finish()
        proc.kill()
        proc.wait()


def test_the_fence_never_takes_a_slow_check_for_a_cut(settings):
    """Timeouts compressed below a few check periods (the e2e pool's: lost after 3 s) keep five check periods."""
    settings.E31_NODE_TIMEOUT_S, settings.E31_HEARTBEAT_S, settings.E31_KILL_GRACE_S = 3.0, 0.5, 1.0
    assert agent.fence_after_s() == 5 * agent.CHECK_EVERY_S
    settings.E31_NODE_TIMEOUT_S, settings.E31_HEARTBEAT_S, settings.E31_KILL_GRACE_S = 30.0, 5.0, 10.0
    assert agent.fence_after_s() == 14.0  # the defaults
