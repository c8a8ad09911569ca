"""The embedded broker hands no reader a half-written message, and a bad file kills no worker (issue 15);
a message past its expiration is deleted, not delivered, so the store stays bounded with no worker."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from queue import Empty

import pytest
from celery import Celery
from celery.beat import Scheduler
from django.conf import settings
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


def test_a_message_past_its_expiration_is_deleted_rather_than_delivered(tmp_path):
    with connection(tmp_path) as conn:
        queue = conn.SimpleQueue(QUEUE)
        queue.put({"n": "stale"}, expiration=0.05)
        queue.put({"n": "due"}, expiration=60)
        queue.put({"n": "kept"})  # no expiration: kept however long no reader comes
        time.sleep(0.1)
        got = []
        for _ in range(2):
            message = queue.get(timeout=2)
            got.append(message.payload["n"])
            message.ack()
        with pytest.raises(Empty):
            queue.get(timeout=0.2)
    assert sorted(got) == ["due", "kept"]  # published the same millisecond: in either order
    assert os.listdir(tmp_path / "in") == [] and os.listdir(tmp_path / "processed") == []


def test_a_publisher_sweeps_expired_messages_while_no_reader_comes(tmp_path, monkeypatch):
    monkeypatch.setattr(broker, "SWEEP_EVERY_S", 0.0)
    with connection(tmp_path) as conn:
        producer = conn.SimpleQueue(QUEUE)
        for n in range(20):  # beat's passes, no worker to take them
            producer.put({"n": n}, expiration=0.05)
        time.sleep(0.1)
        producer.put({"n": "last"}, expiration=60)
    assert len(os.listdir(tmp_path / "in")) == 1


def test_periodic_passes_published_while_no_worker_consumes_expire(tmp_path):
    """Beat keeps publishing its safety nets (reaper and notifications every 5 s, beat heartbeat every 15 s,
    the scheduler pass, …) whether or not a control worker consumes them. Under `make run` a worker that
    cannot start (restarted every 30 s, forever) would leave beat filling var/broker/in with tens of
    thousands of files a day, every poll of every queue listing and sorting the whole folder, and a worker
    back from the outage replaying every stale pass in order, ahead of the job dispatches published after
    them. So each pass beat publishes expires (after its own period, a minute at least): the broker drops it, and a worker
    back from an outage would discard it."""
    for sub in ("in", "processed", "control"):
        (tmp_path / sub).mkdir()
    app = Celery("beat-expiry", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.conf.broker_url = "filesystem://"
    app.conf.broker_transport = "e31web.broker:Transport"
    app.conf.broker_transport_options = {
        "data_folder_in": str(tmp_path / "in"), "data_folder_out": str(tmp_path / "in"),
        "processed_folder": str(tmp_path / "processed"), "control_folder": str(tmp_path / "control"),
    }  # fmt: skip
    scheduler = Scheduler(app, lazy=True)
    scheduler.setup_schedule()
    with app.producer_or_acquire() as producer:
        for entry in scheduler.schedule.values():
            scheduler.apply_async(entry, producer=producer, advance=False)
    published = {}
    for path in (tmp_path / "in").iterdir():
        headers = json.loads(path.read_bytes())["headers"]
        published[headers["task"]] = headers.get("expires")
    assert set(published) == {e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()}
    never_expire = sorted(task for task, expires in published.items() if not expires)
    assert never_expire == [], f"published by beat with no expiry: {never_expire}"


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
    # Migrated first, as `make run` does: a worker refuses a database whose migrations are not its code's.
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True
    )
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
