"""API authentication (``Authorization: Bearer <token>`` or the browser's session) and its throttle."""

import hashlib
import time

from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone
from ninja.errors import HttpError, Throttled
from ninja.security import HttpBearer, SessionAuth
from ninja.throttling import BaseThrottle

from accounts import selectors, services
from common import clients, ratelimit

READING_METHODS = ("GET", "HEAD", "OPTIONS")


class BearerToken(HttpBearer):
    """A refused token leaves ``request.api_auth_problem``: the 401 says what is wrong with it."""

    def __call__(self, request: HttpRequest):
        scheme = request.headers.get(self.header, "").partition(" ")[0]
        if scheme and scheme.lower() != self.openapi_scheme:
            request.api_auth_problem = (
                f"The Authorization header is not a Bearer token ({scheme[:20]!r}): "
                "send 'Authorization: Bearer <token>'."
            )
        return super().__call__(request)

    def authenticate(self, request: HttpRequest, token: str):
        # ninja keeps what follows the first space, but RFC 7235 allows more than one: "Bearer  <token>".
        token = token.strip()
        row = services.live_token(token=token, now=timezone.now())
        if row is None:
            request.api_auth_problem = selectors.why_token_refused(token)
            _count_failure(request)  # ninja runs throttles only after authentication succeeds
            return None
        if row.read_only and request.method not in READING_METHODS:
            _count_failure(request)
            raise HttpError(
                403, f"token {row.prefix}… ({row.label}) is read-only: it may list and read, not change anything; "
                "use a token made without 'Read only' on the API tokens page",
            )  # fmt: skip
        request.user = row.user
        request.api_token_digest = row.digest  # what the throttle counts by
        return row.user


def _count_failure(request: HttpRequest) -> None:
    """A bad token counts against its client address at E31_API_RATE; past it, 429 with Retry-After."""
    if wait := ratelimit.wait_past_rate(f"api-auth-failed:{_address(request)}", settings.E31_API_RATE):
        raise Throttled(wait=wait)


class ApiThrottle(BaseThrottle):
    """``E31_API_RATE`` requests per token (per user for a browser session), else per client address.

    django-ninja's throttle hook answers 429 with Retry-After; the count is the one rate limiter's
    (common.ratelimit), in clock-aligned windows so Retry-After is exactly the time to the next one.
    Ninja's own SimpleRateThrottle rewrites a list of every request's time on each request, which
    grows with the rate; a counter does not. Read per request, so the rate changes without a restart.
    """

    def allow_request(self, request: HttpRequest) -> bool:
        if ratelimit.wait_past_rate(f"api:{_ident(request)}", settings.E31_API_RATE):
            return False
        # A user's tokens together: at most as many rates as live tokens, however many are revoked and made anew.
        user_wide = request.user.is_authenticated and getattr(request, "api_token_digest", "")
        return not (
            user_wide
            and ratelimit.wait_past_rate(
                f"api-user:{request.user.pk}", settings.E31_API_RATE, times=services.ACTIVE_TOKENS
            )
        )

    def wait(self) -> float:
        # The windows are clock-aligned: the wait is the time to the next one (nothing kept on this
        # instance, which every request thread shares).
        _, period = ratelimit.parse_rate(settings.E31_API_RATE)
        return period - time.time() % period


def _ident(request: HttpRequest) -> str:
    if digest := getattr(request, "api_token_digest", ""):
        return f"token:{digest}"
    if request.user.is_authenticated:
        return f"user:{request.user.pk}"
    return "addr:" + _address(request)


def _address(request: HttpRequest) -> str:
    address = clients.client_network(request) or "unknown"  # an IPv6 client by its network
    return hashlib.sha256(address.encode()).hexdigest()[:32]


API_AUTH = [BearerToken(), SessionAuth()]
