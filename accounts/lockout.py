"""Sign-in lockout, by django-axes: after ``E31_LOGIN_FAILURE_LIMIT`` failed sign-ins for one username
from one client address, that pair's next attempts get HTTP 429 until ``E31_LOGIN_WINDOW_S`` has passed
since its last failure; a successful sign-in clears the count.

Per (username, client address), so nobody can lock an operator out from elsewhere and one office
behind a shared address does not lock out its colleagues. The failures are rows in the database
(axes' AccessAttempt), so every web process sees the same count; operators can read them in the
admin and clear one with ``manage.py axes_reset_username NAME``. The address is the client's,
not the load balancer's, and an IPv6 client's is its network (``common.clients.client_network``: one /64
is one client). Axes is wired up in settings (``AXES_*``).
"""

from datetime import timedelta

from axes.backends import AxesStandaloneBackend
from axes.exceptions import AxesBackendPermissionDenied
from axes.helpers import get_client_ip_address
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from accounts.backends import stored_username


class LockoutBackend(AxesStandaloneBackend):
    """Refuses a locked-out (username, address) before any password is checked.

    A sign-in without a request (server-side code, the test client's ``login``) is no HTTP client
    and has no address to count against, so it is left to the other backends.
    """

    def authenticate(self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs):  # fmt: skip
        if request is None:
            return None
        if address_locked_out(request):
            request.axes_locked_out = request.e31_address_locked_out = (
                True  # AxesMiddleware answers `refused`
            )
            raise AxesBackendPermissionDenied("too many failed sign-ins from this address")
        return super().authenticate(request, username=username, password=password, **kwargs)


def address_locked_out(request: HttpRequest) -> bool:
    """Whether the client's address failed E31_LOGIN_FAILURES_PER_ADDRESS sign-ins within the window, whatever the
    usernames: the pairs' counts alone let one address try a few passwords on every account. Read from axes' own
    rows (one per username, address and browser), so it counts what the pairs count."""
    since = timezone.now() - window()
    failures = AccessAttempt.objects.filter(
        ip_address=get_client_ip_address(request), attempt_time__gte=since
    )
    total = failures.aggregate(n=Sum("failures_since_start"))["n"] or 0
    return total >= settings.E31_LOGIN_FAILURES_PER_ADDRESS


def username(request: HttpRequest, credentials: dict | None) -> str:
    """The account as counted: named by its username in any case or by its e-mail address (both sign in,
    ``accounts.backends``), one count under its own username, which ``axes_reset_username`` takes as the
    account spells it (no two differ only by case: ``accounts.usernames``); a name that is no account's,
    one count whatever its case or spaces."""
    name = str((credentials or {}).get("username") or request.POST.get("username", "")).strip()
    stored = stored_username(name)
    if get_user_model()._default_manager.filter(username=stored).exists():
        return stored[:150]
    return name.lower()[:150]


def failure_limit(request: HttpRequest, credentials: dict | None) -> int:
    return settings.E31_LOGIN_FAILURE_LIMIT  # read per request, so a test or an operator can change it


def window(request: HttpRequest | None = None) -> timedelta:
    return timedelta(seconds=settings.E31_LOGIN_WINDOW_S)


def refused(request: HttpRequest, original_response: HttpResponse | None, credentials: dict | None) -> HttpResponse:  # fmt: skip
    """What a locked-out sign-in gets: 429 with Retry-After.

    Axes calls this also for the failure that reaches the limit; that attempt's password was checked
    and it failed like the ones before it, so it gets the form with its error: the lock holds from
    the next attempt, so the limit's number of failures are answered and the next one is refused.
    """
    counted = getattr(request, "axes_failures_since_start", None) is not None
    if counted and original_response is not None:
        return original_response
    what = "sign-in-address" if getattr(request, "e31_address_locked_out", False) else "sign-in"
    response = render(request, "pages/too_many.html", {"what": what}, status=429)
    response["Retry-After"] = str(settings.E31_LOGIN_WINDOW_S)
    return response
