"""Sign-in throttling: too many failed posts for one username from one address get HTTP 429.

Failures are counted per (username, address) in the Django cache, in a fixed window opened by
the first failure; a successful sign-in clears the count. Counting per pair, not per address,
keeps one office behind a shared address from locking its colleagues out.
"""

import hashlib

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

_login = auth_views.LoginView.as_view(template_name="accounts/login.html")


def _key(request: HttpRequest) -> str:
    # Hashed: a username is user input, and cache backends limit key length and characters.
    username = request.POST.get("username", "").strip().lower()[:150]
    addr = request.META.get("REMOTE_ADDR") or "unknown"
    digest = hashlib.sha256(f"{username}\0{addr}".encode()).hexdigest()[:32]
    return f"e31:login-failures:{digest}"


def _failures(key: str) -> int:
    return cache.get(key, 0)


def _count_failure(key: str) -> None:
    window = settings.E31_LOGIN_WINDOW_S
    cache.add(key, 0, timeout=window)  # only the first failure of a window sets its expiry
    try:
        cache.incr(key)
    except ValueError:  # the window ended between add and incr
        cache.set(key, 1, timeout=window)


def _too_many(request: HttpRequest) -> HttpResponse:
    response = render(request, "pages/too_many.html", status=429)
    response["Retry-After"] = str(settings.E31_LOGIN_WINDOW_S)
    return response


def login(request: HttpRequest, *args, **kwargs) -> HttpResponse:
    """Django's LoginView, refusing a POST once its (username, address) pair has failed too often."""
    if request.method != "POST":
        return _login(request, *args, **kwargs)
    key = _key(request)
    if _failures(key) >= settings.E31_LOGIN_FAILURE_LIMIT:
        return _too_many(request)
    response = _login(request, *args, **kwargs)
    if response.status_code == 302:
        cache.delete(key)
    elif response.status_code == 200:  # the form came back with its errors: a failed sign-in
        _count_failure(key)
    return response
