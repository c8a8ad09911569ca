"""The embedded broker hands no reader a half-written message, and a bad file kills no worker (issue 15)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kombu import Connection, Queue
from kombu.transport import virtual

from e31web import broker

ROOT = Path(__file__).resolve().parents[2]
QUEUE = "probe"


@pytest.fixture(autouse=True)
def fresh_bindings(monkeypatch):
    """The transport remembers bindings per process; each test has folders of its own."""
    monkeypatch.setattr(broker.Transport, "global_state", virtual.BrokerState())


def connection(folder: Path) -> Connection:
    for sub in ("in", "processed", "control"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    options = {"data_folder_in": str(folder / "in"), "data_folder_out": str(folder / "in"),
               "processed_folder": str(folder / "processed"), "control_folder": str(folder / "control")}  # fmt: skip
    return Connection("filesystem://", transport=broker.Transport, transport_options=options)


def drop_bad_messages(queue_folder: Path) -> list[Path]:
    """What a reader of kombu's own transport could find: an empty file and one cut off mid-write."""
    # Named to sort before any message kombu names (milliseconds of uptime), so they are read first.
    bad = [queue_folder / f"0_a_empty.{QUEUE}.msg", queue_folder / f"0_b_half.{QUEUE}.msg"]
    bad[0].write_bytes(b"")
    bad[1].write_bytes(json.dumps({"body": "x" * 100, "headers": {}})[:40].encode())
    return bad


def test_a_reader_sets_bad_files_aside_and_takes_the_next_message(tmp_path):
    with connection(tmp_path) as conn:
        bad = drop_bad_messages(tmp_path / "in")
        queue = conn.SimpleQueue(QUEUE)
        queue.put({"n": 1})
        message = queue.get(timeout=2)
        assert message.payload == {"n": 1}
        message.ack()
        assert not any(path.exists() for path in bad)
        aside = sorted(p.name for p in (tmp_path / "processed").iterdir())
        assert aside == [p.name + broker.UNREADABLE_SUFFIX for p in bad]


def test_delivered_messages_leave_nothing_behind(tmp_path):
    with connection(tmp_path) as conn:
        queue = conn.SimpleQueue(QUEUE)
        for n in range(50):
            queue.put({"n": n})
        got = []
        for _ in range(50):
            message = queue.get(timeout=2)
            got.append(message.payload["n"])
            message.ack()
    assert sorted(got) == list(range(50))
    assert os.listdir(tmp_path / "in") == [] and os.listdir(tmp_path / "processed") == []


def test_readers_racing_writers_see_every_message_whole_and_once(tmp_path):
    """Eight writers and two readers at once: no message lost, doubled or unreadable."""
    writers, each = 8, 100
    got: list[int] = []

    def write(w: int) -> None:
        with connection(tmp_path) as conn:
            queue = conn.SimpleQueue(QUEUE)
            for n in range(each):
                queue.put({"n": w * each + n, "pad": "x" * 20000})  # large enough to be written in parts

    def read() -> None:
        with connection(tmp_path) as conn:
            queue = conn.SimpleQueue(QUEUE)
            deadline = time.monotonic() + 60
            while len(got) < writers * each and time.monotonic() < deadline:
                try:
                    message = queue.get(timeout=0.2)
                except queue.Empty:
                    continue
                got.append(message.payload["n"])
                message.ack()

    with connection(tmp_path) as conn:
        conn.SimpleQueue(QUEUE)  # bound before the race: the race under test is over message files
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    threads += [threading.Thread(target=read) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(got) == list(range(writers * each))
    assert not list((tmp_path / "processed").iterdir())  # nothing was set aside as unreadable


def test_two_queues_bound_at_once_are_both_in_the_table(tmp_path):
    """Binding rewrites the exchange's table: two processes binding at once must not lose one."""
    barrier = threading.Barrier(8)

    def bind(n: int) -> None:
        with connection(tmp_path) as conn:
            barrier.wait()
            Queue(f"q{n}", exchange="shared", routing_key=f"q{n}", channel=conn.channel()).declare()

    threads = [threading.Thread(target=bind, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with connection(tmp_path) as conn:
        assert {q.queue for q in conn.default_channel.get_table("shared")} == {f"q{n}" for n in range(8)}


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_a_worker_handed_an_empty_and_a_half_written_message_keeps_serving(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "E31_TEST_DB_NAME")
    }
    env.update(E31_STATE_DIR=str(tmp_path / "var"), PYTHONUNBUFFERED="1")
    queue_folder = tmp_path / "var" / "broker" / "in"
    queue_folder.mkdir(parents=True)
    drop_bad_messages(queue_folder)
    log = open(tmp_path / "worker.log", "wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "e31web", "worker", "-Q", QUEUE, "--pool", "solo",
         "--include", "tests.e2e.broker_probe", "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        marker = tmp_path / "delivered"
        subprocess.run(
            [sys.executable, "-c", "import django; django.setup(); from e31web.celery import app; "
             f"app.send_task('tests.broker_probe.touch', ({str(marker)!r},), queue={QUEUE!r})"],
            cwd=ROOT, env={**env, "DJANGO_SETTINGS_MODULE": "e31web.settings"}, check=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not marker.exists() and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        output = (tmp_path / "worker.log").read_text(errors="replace")
        assert worker.poll() is None, output[-3000:]
        assert marker.read_text() == "delivered", output[-3000:]
        assert "unreadable broker message" in output
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=20)
        log.close()
