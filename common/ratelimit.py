"""The one rate limiter: fixed-window counts in the cache every web process shares.

``hit`` counts one event under a key for a window; the public forms (per client address,
``common.clients``) and the API throttle (per token, ``accounts.auth``) both count through it.
Counts live where every web process sees them, never in one process's memory, so two web workers
count together: with the database cache (the default) in ``RateCount``, one upsert per event that
adds one and returns the new count (Django's database cache has no atomic incr: it reads then
writes, and resets the expiry); with Redis (``E31_CACHE_URL``) in the cache, by one script that
INCRs and sets the expiry when the INCR opened the window, so no count is ever left without one.
Either way a window lasts exactly ``window_s``.

Public forms: the first post opens a window; past ``E31_PUBLIC_FORM_LIMIT`` posts within
``E31_PUBLIC_FORM_WINDOW_S`` seconds the client gets HTTP 429 until the window ends.
"""

import math
import time
from collections.abc import Callable
from functools import wraps

from django.conf import settings
from django.core.cache import cache, caches
from django.core.cache.backends.db import DatabaseCache
from django.core.cache.backends.redis import RedisCache
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from common import clients

# A new window (count 1) replaces an expired one in the same statement; the row lock the upsert
# takes makes parallel events count one after another on PostgreSQL, SQLite has one writer anyway.
_UPSERT = """
    INSERT INTO common_ratecount (key, count, expires_at) VALUES (%s, 1, %s)
    ON CONFLICT (key) DO UPDATE SET
        count = CASE WHEN common_ratecount.expires_at <= %s THEN 1 ELSE common_ratecount.count + 1 END,
        expires_at = CASE WHEN common_ratecount.expires_at <= %s THEN excluded.expires_at
                          ELSE common_ratecount.expires_at END
    RETURNING count
"""

# One step on Redis: an add then an INCR apart would let a window that ends between them leave the
# count INCR creates with no expiry, one that never ends (a 429 for good). A count found without an
# expiry (left so before) gets one too.
_COUNT = """
local count = redis.call('INCR', KEYS[1])
if count == 1 or redis.call('TTL', KEYS[1]) == -1 then
    redis.call('EXPIRE', KEYS[1], ARGV[1])
end
return count
"""


def hit(key: str, *, window_s: int) -> int:
    """Counts one event under ``key``; returns the count in the window the first event opened."""
    key = f"e31:limit:{key}"
    shared = caches["default"]
    if isinstance(shared, DatabaseCache):
        return _hit_table(key, window_s=window_s, now=time.time())
    if isinstance(shared, RedisCache):
        return _hit_redis(shared, key, window_s=window_s)
    return _hit_cache(key, window_s=window_s)


def _hit_table(key: str, *, window_s: int, now: float) -> int:
    with connection.cursor() as cursor:
        cursor.execute(_UPSERT, [key, now + window_s, now, now])
        (count,) = cursor.fetchone()
        if count == 1:  # a window opened: the same moment clears the windows that have ended
            cursor.execute("DELETE FROM common_ratecount WHERE expires_at <= %s", [now])
    return count


def _hit_redis(shared: RedisCache, key: str, *, window_s: int) -> int:
    key = shared.make_and_validate_key(key)
    client = shared._cache.get_client(key, write=True)
    # EVALSHA: the server keeps the script after its first use, so each event sends its digest, not its text
    # (registering only works the digest out; the text goes again only if the server has lost it).
    return int(client.register_script(_COUNT)(keys=[key], args=[int(window_s)]))


def _hit_cache(key: str, *, window_s: int) -> int:
    window = window_s
    cache.add(key, 0, timeout=window)  # only the first event of a window sets the expiry
    try:
        return cache.incr(key)
    except ValueError:  # the window expired between add and incr
        cache.set(key, 1, timeout=window)
        return 1


def parse_rate(rate: str) -> tuple[int, int]:
    """A rate setting such as "600/m": (600, 60). Periods: s, m, h, d (the settings check the form)."""
    count, _, unit = rate.partition("/")
    return int(count), {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit.strip()[:1]]


def wait_past_rate(key: str, rate: str, *, times: int = 1) -> int:
    """Counts one event under ``key`` at ``times`` x ``rate`` ("30/m"), in clock-aligned windows: 0 while
    within it, else the whole seconds until the next window opens (what Retry-After says)."""
    limit, period = parse_rate(rate)
    now = time.time()
    if hit(f"{key}:{int(now // period)}", window_s=period) <= limit * times:
        return 0
    return max(1, math.ceil(period - now % period))


def over_limit(request: HttpRequest, *, scope: str = "public", key: str = "") -> bool:
    """Whether this post is past the limit of its ``key``'s window: the client's address (network) unless given."""
    who = key or clients.client_network(request) or "unknown"
    count = hit(f"public-form:{scope}:{who}", window_s=settings.E31_PUBLIC_FORM_WINDOW_S)
    return count > settings.E31_PUBLIC_FORM_LIMIT


def limit_posts(scope: str = "public", *, counted_by: Callable[[HttpRequest], str] | None = None) -> Callable:
    """Decorator for a public form view: every POST counts, valid or not; per client address, or per what
    ``counted_by`` says of the request (an empty answer: the address)."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            key = counted_by(request) if counted_by else ""
            if request.method == "POST" and over_limit(request, scope=scope, key=key):
                response = render(request, "pages/too_many.html", status=429)
                response["Retry-After"] = str(settings.E31_PUBLIC_FORM_WINDOW_S)
                return response
            return view(request, *args, **kwargs)

        return wrapped

    return decorator
