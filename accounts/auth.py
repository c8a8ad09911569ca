"""API authentication: ``Authorization: Bearer <token>`` or the browser's session."""

from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer, SessionAuth

from accounts import services


class BearerToken(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str):
        user = services.user_for_token(token=token, now=timezone.now())
        if user is not None:
            request.user = user
        return user


API_AUTH = [BearerToken(), SessionAuth()]
