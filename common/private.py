"""A signed-in page or an answer to an API token is the team's own: no cache may store it.

Without Cache-Control a shared proxy that caches by heuristics, or the disk cache of a shared machine,
keeps what a member saw: a new API token or webhook secret shown once, a job's command and log tail,
the ledger. Pages for visitors (the public pages, sign-in) keep whatever caching they set.
"""

from django.http import HttpRequest, HttpResponse
from django.utils.cache import patch_cache_control


class PrivateResponsesMiddleware:
    """After authentication: ``private, no-store`` on every answer to a signed-in user or to a bearer token."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if "HTTP_AUTHORIZATION" in request.META or request.user.is_authenticated:
            patch_cache_control(response, private=True, no_store=True)
        return response
