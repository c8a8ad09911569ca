"""API authentication (``Authorization: Bearer <token>`` or the browser's session) and its throttle."""

import hashlib

from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer, SessionAuth
from ninja.throttling import SimpleRateThrottle

from accounts import services
from common import clients


class BearerToken(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str):
        user = services.user_for_token(token=token, now=timezone.now())
        if user is not None:
            request.user = user
            request.api_token_digest = services.digest_token(token)  # what the throttle counts by
        return user


class ApiThrottle(SimpleRateThrottle):
    """``E31_API_RATE`` requests per token (per user for a browser session), else per client address.

    django-ninja's sliding window, kept in the shared cache; over it the API answers 429 with
    Retry-After. The rate is read per request so it can change without a restart of the URLconf.
    """

    scope = "api"

    def __init__(self) -> None:
        super().__init__(settings.E31_API_RATE)

    def allow_request(self, request: HttpRequest) -> bool:
        self.rate = settings.E31_API_RATE
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request)

    def get_cache_key(self, request: HttpRequest) -> str:
        if digest := getattr(request, "api_token_digest", ""):
            ident = f"token:{digest}"
        elif request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            address = clients.client_address(request) or "unknown"
            ident = "addr:" + hashlib.sha256(address.encode()).hexdigest()[:32]
        return self.cache_format % {"scope": self.scope, "ident": ident}


API_AUTH = [BearerToken(), SessionAuth()]
