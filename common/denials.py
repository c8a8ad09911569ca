"""Logs every refused request, so probing for other teams' objects or staff pages leaves a trace.

401, 403 and 429 are logged for everyone; 404 only for signed-in users, since an anonymous 404
is usually a mistyped address while a member's 404 may be a look at another team's job. A guard
that refuses (the operator guard) logs its own reason through ``record``; the middleware then
does not log the same refusal twice.
"""

import logging
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

log = logging.getLogger("e31.denials")
ALWAYS = {401, 403, 429}
_LOGGED = "_e31_denial_logged"


def _who(request: HttpRequest) -> str | None:
    user = getattr(request, "user", None)
    return user.get_username() if user is not None and user.is_authenticated else None


def record(request: HttpRequest, *, status: int, reason: str = "") -> None:
    """Logs one refusal of this request (once: the middleware skips a request already logged)."""
    who = _who(request)
    log.warning(
        "denied %s %s %s to %s%s", status, request.method, request.path, who or "anonymous",
        f" ({reason})" if reason else "",
        extra={"status": status, "path": request.path, "user": who or "", "reason": reason},
    )  # fmt: skip
    setattr(request, _LOGGED, True)


class DenialLogMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        status = response.status_code
        if getattr(request, _LOGGED, False):
            return response
        who = _who(request)  # read after the view: API token auth sets request.user inside it
        if status in ALWAYS or (status == 404 and who is not None):
            record(request, status=status)
        return response
