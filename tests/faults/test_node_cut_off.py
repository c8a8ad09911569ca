"""A node cut off from the database stops its jobs before the platform can give their GPUs to another attempt.

The platform declares a silent node lost E31_NODE_TIMEOUT_S after its last heartbeat and requeues its jobs;
a part that ran on through that (its agent unable to reach the database, its node otherwise fine) would run
beside the job's next attempt: two attempts at once, both writing the same checkpoint, one never metered.
"""

import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import InterfaceError, OperationalError, connection, connections, transaction
from django.utils import timezone

from jobs import agent, rental, sandbox
from jobs.lifecycle import EndReason, State
from jobs.models import Allocation, Job
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def compressed(settings):
    """Declared lost after 8 s of silence, a beat every 0.5 s, 1 s to die at TERM (checks every second)."""
    settings.E31_NODE_TIMEOUT_S, settings.E31_HEARTBEAT_S, settings.E31_KILL_GRACE_S = 8.0, 0.5, 1.0


def _cut_off(*args, **kwargs):
    raise OperationalError("could not connect to server: Connection timed out")


PART = SimpleNamespace(allocation=SimpleNamespace(id=1))  # what the watcher reads of its part


def _watched(monkeypatch, check) -> tuple[str, float]:
    """Watches a 20-second process with ``check`` standing in for the stop checks; (reason, seconds)."""
    monkeypatch.setattr(rental, "stop_reason", check)
    monkeypatch.setattr(agent, "_keep_up", lambda *args, **kwargs: None)
    proc = subprocess.Popen(["sleep", "20"])
    watcher = agent.Watcher(PART, None)
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


@pytest.mark.parametrize("error", [InterfaceError("connection already closed"), KeyError("a bug")])
def test_a_check_that_raises_anything_does_not_end_the_parts_checks(compressed, monkeypatch, error):
    """An ``InterfaceError`` is no ``DatabaseError``, and a bug raises anything: either ended the watcher's thread,
    so no cancel, preemption or limit was seen again, no log shipped, no sign of life, and five seconds later
    (fourteen by default) a part whose database answered was stopped as cut off and requeued as lost."""
    checks = []

    def failing_once(*args, **kwargs):
        checks.append(time.monotonic())
        if len(checks) == 1:
            raise error
        return "cancelled" if len(checks) >= 3 else ""

    reason, _took = _watched(monkeypatch, failing_once)
    assert len(checks) >= 3, f"the checks ended after {len(checks)}"
    assert reason == "cancelled"


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

    def check(*args, **kwargs) -> str:  # what a stop check does: a query on the agent's connection
        wrapper = held.setdefault("wrapper", connections["default"].__class__(relayed, alias="cut"))
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT 1")
        answered.append(time.monotonic())
        return ""

    monkeypatch.setattr(rental, "stop_reason", check)
    monkeypatch.setattr(agent, "_keep_up", lambda *args, **kwargs: None)
    proc = subprocess.Popen(["sleep", "60"])
    watcher = agent.Watcher(PART, None)
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


@pytest.mark.django_db(transaction=True)  # the watcher reads what the test committed
def test_a_slow_log_shipment_does_not_fence_a_part_whose_stop_checks_answer(
    team, compressed, monkeypatch, tmp_path
):
    """The job prints 10 MB (its log cap) at once; the node's link to the database carries 1.5 MB/s, so shipping it
    takes ~7 s, while a stop check answers in milliseconds. The watcher runs stop check, tail, the whole unshipped
    log and sign of life in one ``_check``, and counts the fence from the start of the last ``_check`` that
    completed: the part is stopped as cut off (FENCED: released as node_lost, requeued) while the platform was
    reachable all along, and no cancel could have been seen for those seconds either. At the default timings
    (fence 14 s) the same happens on a link under ~0.75 MB/s, or to any check waiting ~13 s on a row lock."""
    node = NodeFactory(name="gpu-slow", gpus=1)
    job = JobFactory(team=team)
    began = timezone.now() - timedelta(minutes=1)
    assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: (0,)}, now=began)
    allocation = Allocation.objects.get(job=job)
    assert rental.start_allocation(allocation_id=allocation.id, now=began)
    part = agent._load_part(allocation.id, sandbox.UNSANDBOXED, None)

    shipments = []

    def slow_link(part, offset, data):
        shipments.append(time.monotonic())
        time.sleep(len(data) / 1.5e6)

    monkeypatch.setattr(agent, "_ship_log", slow_link)
    stop_checks = []
    real_stop_reason = rental.stop_reason

    def timed_stop_reason(**kwargs):
        reason = real_stop_reason(**kwargs)
        stop_checks.append(time.monotonic())
        return reason

    monkeypatch.setattr(rental, "stop_reason", timed_stop_reason)
    code = "import sys, time\nsys.stdout.write('x' * 10**7); sys.stdout.flush()\ntime.sleep(10)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    capture = agent.LogCapture(proc.stdout, tmp_path / "job.log", 10**7)
    capture.start()
    time.sleep(1.0)  # the output is captured before the first check
    watcher = agent.Watcher(part, capture)
    watcher.start()
    began_watch = time.monotonic()
    try:
        reason = agent._watch(proc, watcher)
        took = time.monotonic() - began_watch
    finally:
        proc.kill()
        proc.wait()
        watcher.finish()
        capture.join(5)
        connections.close_all()
    assert stop_checks, "no stop check ran"
    # '' is _watch's answer once the job exited by itself: neither fenced nor stopped for any other reason
    assert reason == "", f"stopped ({reason}) after {took:.1f} s though the platform answered its stop checks"


def _committed_release(allocation_id: int):
    """The allocation's release as any other process sees it: on a connection of its own."""
    seen = []

    def read() -> None:
        try:
            seen.append(Allocation.objects.values_list("released_at", flat=True).get(id=allocation_id))
        finally:
            connections.close_all()

    reader = threading.Thread(target=read)
    reader.start()
    reader.join(10)
    return seen[0]


@pytest.mark.django_db(transaction=True)  # the platform reads only what was committed
def test_a_slow_check_outliving_supervise_does_not_swallow_the_parts_release(
    pool, team, monkeypatch, tmp_path
):
    """A busy database: the check under way when the process exits takes 4 s (as ``append_log``'s bulk_create, in a
    transaction). ``Watcher.finish`` gives up after 2 s and hands the connection back to the part's thread while
    the check still runs on it; when the check ends, its commit is refused (sharing already ended) and the shared
    connection is left in an open transaction with autocommit off. Every write the part's thread makes after that
    (here its release) is never committed: its GPU stays held, and metered, until the reconciler gives up on it."""
    job = JobFactory(team=team)
    now = timezone.now()
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=now)
    allocation = Allocation.objects.get(job=job)
    assert rental.start_allocation(allocation_id=allocation.id, now=now)

    def slow_check(**kwargs):
        with transaction.atomic(savepoint=False):  # as LogChunk.objects.bulk_create opens one
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_sleep(4)")
        return ""

    monkeypatch.setattr(agent.rental, "stop_reason", slow_check)
    made = []

    class Recorded(agent.Watcher):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(agent, "Watcher", Recorded)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"], stdout=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    capture = agent.LogCapture(proc.stdout, tmp_path / "job.log", 10**6)
    capture.start()
    try:
        assert agent._supervise(
            SimpleNamespace(allocation=allocation), proc, capture, sandbox.UNSANDBOXED
        ) == ("", 0)
        # The part's thread next writes after its clean-up (reown, unwire, cgroups): the late check has ended by then.
        made[0].join(10)
        assert rental.release_part(allocation_id=allocation.id, end_reason=EndReason.CANCELLED,
                                   now=timezone.now(), actor="agent:gpu-01")  # fmt: skip
        assert _committed_release(allocation.id) is not None, (
            "the part's release was written inside the watcher's abandoned transaction and never committed"
        )
    finally:
        made[0].join(10)
        connections["default"].close()  # whatever is left open goes, before the test's flush
