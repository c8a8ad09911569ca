"""The shared rate limiter on the default (database) cache: every parallel event counts, and a
window lasts the window_s it was opened with (the database cache reset it to its 300 s default); on
Redis, no count is ever left without an expiry."""

import threading
import time
import uuid
from datetime import timedelta

import pytest
import time_machine
from django.core.cache import caches
from django.db import connection
from django.utils import timezone
from redis.commands.core import Script

from common import ratelimit

REDIS = "redis://127.0.0.1:6379/14"

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


@pytest.fixture
def redis_cache(settings):
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS}
    }
    return caches["default"]


def test_on_redis_a_window_that_ends_between_two_round_trips_still_ends(redis_cache, monkeypatch):
    """Counted as an add then an INCR (Django's Redis incr is EXISTS then INCR, two round trips), a post
    that arrives as the window's key expires could see EXISTS true and then INCR a key that has just gone:
    Redis creates it at 1 with no expiry, and the client (public form, per address) or the team admin
    (invitations, per user) gets 429 for good once past the limit. Here the key is made to expire exactly
    between the two round trips, as it can by chance on a busy limiter."""
    key = f"race-{uuid.uuid4().hex}"
    try:
        _race_then_look(redis_cache, monkeypatch, key)
    finally:
        redis_cache.delete(f"e31:limit:{key}")


def _race_then_look(redis_cache, monkeypatch, key: str) -> None:
    assert ratelimit.hit(key, window_s=1) == 1
    client_of = redis_cache._cache.get_client
    armed = True

    class ExpiresNow:
        def __init__(self, client) -> None:
            self._client = client

        def exists(self, *names):
            nonlocal armed
            found = self._client.exists(*names)
            if armed and found:
                armed = False
                self._client.delete(*names)  # the window's TTL runs out this very moment
            return found

        def __getattr__(self, name):
            return getattr(self._client, name)

    monkeypatch.setattr(redis_cache._cache, "get_client", lambda *a, **k: ExpiresNow(client_of(*a, **k)))
    ratelimit.hit(key, window_s=1)  # the unlucky event
    monkeypatch.undo()
    time.sleep(1.3)  # past any window of one second
    assert ratelimit.hit(key, window_s=1) == 1, "the count outlived its window: it has no expiry"


def test_on_redis_a_count_left_without_an_expiry_gets_one(redis_cache):
    key = f"stuck-{uuid.uuid4().hex}"
    stored = redis_cache.make_and_validate_key(f"e31:limit:{key}")
    client = redis_cache._cache.get_client(stored, write=True)
    try:
        client.set(stored, 40)  # a count an earlier limiter left with no expiry
        assert ratelimit.hit(key, window_s=60) == 41
        assert 0 < client.ttl(stored) <= 60
    finally:
        client.delete(stored)


def test_on_redis_the_counting_script_travels_once_then_by_its_digest(redis_cache, monkeypatch):
    """EVAL sends the script's text with every event; EVALSHA sends its SHA-1 (the text only when the
    server has lost it, as after a restart or a SCRIPT FLUSH)."""
    key = f"digest-{uuid.uuid4().hex}"
    client_of = redis_cache._cache.get_client
    sent: list[str] = []

    class Recording:
        def __init__(self, client) -> None:
            self._client = client

        def register_script(self, script):
            return Script(self, script)

        def __getattr__(self, name):
            if name in ("eval", "evalsha", "script_load"):
                sent.append(name)
            return getattr(self._client, name)

    monkeypatch.setattr(redis_cache._cache, "get_client", lambda *a, **k: Recording(client_of(*a, **k)))
    try:
        client_of(write=True).script_flush()
        counts = [ratelimit.hit(key, window_s=60) for _ in range(3)]
    finally:
        client_of(write=True).delete(redis_cache.make_and_validate_key(f"e31:limit:{key}"))
    assert counts == [1, 2, 3]
    assert "eval" not in sent
    assert sent == ["evalsha", "script_load", "evalsha", "evalsha", "evalsha"]
