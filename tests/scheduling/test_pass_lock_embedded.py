"""One scheduler pass at a time on the embedded default (SQLite) too.

Reproduction (read): on SQLite ``pass_lock`` yielded True to everyone, and a pass is not one transaction; the
control worker runs 4 threads, so beat's safety pass and a requested pass each planned from its own snapshot.
The database still refused a GPU held twice, but a pass planning from the older snapshot could ask a
preemptible job to stop for a reservation the other had already placed, and overwrite newer estimates.
"""

import threading
from types import SimpleNamespace

from jobs import scheduler


def test_on_sqlite_a_second_pass_waits_for_the_first(monkeypatch, settings, tmp_path):
    settings.STATE_DIR = tmp_path
    monkeypatch.setattr(scheduler, "connection", SimpleNamespace(vendor="sqlite"))
    inside, leave = threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with scheduler.pass_lock() as held:
            seen.append(held)
            inside.set()
            leave.wait(10)

    runner = threading.Thread(target=first)
    runner.start()
    assert inside.wait(10)
    with scheduler.pass_lock(wait_s=0.2) as second:
        assert second is False  # another thread holds it for all of wait_s
    leave.set()
    runner.join(10)
    with scheduler.pass_lock() as third:
        assert third is True  # let go once the first ended
    assert seen == [True]
