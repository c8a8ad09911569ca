"""The shared rate limiter on the default (database) cache: every parallel event counts, and a
window lasts the window_s it was opened with (the database cache reset it to its 300 s default)."""

import threading
from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.utils import timezone

from common import ratelimit

pytestmark = pytest.mark.django_db(transaction=True)


def test_parallel_hits_each_count_once():
    hits, barrier, counts, errors = 16, threading.Barrier(16), [], []

    def one_hit() -> None:
        try:
            barrier.wait()
            counts.append(ratelimit.hit("parallel", window_s=600))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=one_hit) for _ in range(hits)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert sorted(counts) == list(range(1, hits + 1))
    assert ratelimit.hit("parallel", window_s=600) == hits + 1


def test_a_window_lasts_window_s():
    opened = timezone.now()
    with time_machine.travel(opened, tick=False):
        assert ratelimit.hit("window", window_s=600) == 1
    with time_machine.travel(opened + timedelta(seconds=5), tick=False):
        assert ratelimit.hit("window", window_s=600) == 2  # counted again: the expiry is not reset
    with time_machine.travel(opened + timedelta(seconds=400), tick=False):
        assert ratelimit.hit("window", window_s=600) == 3  # past the cache's 300 s default, still the window
    with time_machine.travel(opened + timedelta(seconds=601), tick=False):
        assert ratelimit.hit("window", window_s=600) == 1  # a new window
