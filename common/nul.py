"""No NUL character reaches a view or a text column: PostgreSQL cannot store one in text, so a query filtering on
it fails, and so does a write (a remote server's answer quoted in a job's reason).

Any path, query or form value carrying one (``?path=%00``, ``/api/v1/teams/%00/secrets``) is answered
400 here, once, instead of each view guarding its own parameters and a forgotten one answering 500.
"""

from django.http import HttpRequest, HttpResponse, JsonResponse

from common import errors

NUL = "\x00"
MESSAGE = "A request cannot carry a NUL character (in its path, query or form)."


def shown(text: str) -> str:
    """``text`` with each NUL written out as ``\\x00``: storable, and the reader sees where one was."""
    return text.replace(NUL, "\\x00")


class RefuseNulMiddleware:
    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if _carries_nul(request):
            if request.path.startswith("/api/"):
                return JsonResponse({"detail": MESSAGE}, status=400)
            return errors.bad_request(request, reason=MESSAGE)
        return self.get_response(request)


def _carries_nul(request: HttpRequest) -> bool:
    if NUL in request.path:
        return True
    forms = (request.GET, request.POST) if request.method == "POST" else (request.GET,)
    return any(
        NUL in key or NUL in value for form in forms for key, values in form.lists() for value in values
    )
