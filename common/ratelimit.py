"""The one rate limiter: fixed-window counts in the cache every web process shares.

``hit`` counts one event under a key for a window; the public forms (per client address,
``common.clients``) and the API throttle (per token, ``accounts.auth``) both count through it.
The cache is the database's cache table by default, Redis when ``E31_CACHE_URL`` names it: never
one process's memory, so two web workers count together. A count is O(1) (add, then incr).

Public forms: the first post opens a window; past ``E31_PUBLIC_FORM_LIMIT`` posts within
``E31_PUBLIC_FORM_WINDOW_S`` seconds the client gets HTTP 429 until the window ends.
"""

from collections.abc import Callable
from functools import wraps

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from common import clients


def hit(key: str, *, window_s: int) -> int:
    """Counts one event under ``key``; returns the count in the window the first event opened."""
    key = f"e31:limit:{key}"
    window = window_s
    cache.add(key, 0, timeout=window)  # only the first event of a window sets the expiry
    try:
        return cache.incr(key)
    except ValueError:  # the window expired between add and incr
        cache.set(key, 1, timeout=window)
        return 1


def over_limit(request: HttpRequest, *, scope: str = "public") -> bool:
    addr = clients.client_address(request) or "unknown"
    count = hit(f"public-form:{scope}:{addr}", window_s=settings.E31_PUBLIC_FORM_WINDOW_S)
    return count > settings.E31_PUBLIC_FORM_LIMIT


def limit_posts(scope: str = "public") -> Callable:
    """Decorator for a public form view: every POST counts, valid or not."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if request.method == "POST" and over_limit(request, scope=scope):
                response = render(request, "pages/too_many.html", status=429)
                response["Retry-After"] = str(settings.E31_PUBLIC_FORM_WINDOW_S)
                return response
            return view(request, *args, **kwargs)

        return wrapped

    return decorator
