"""The console's own pages for requests refused before any view runs: unreadable (400) or refused by
CSRF (403). Django's defaults answer these with a bare page that has no menu and no way back. A path under
/api/ that the API does not have is answered in JSON, as the API answers everything."""

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template.defaultfilters import filesizeformat
from django.views import defaults


def bad_request(request: HttpRequest, exception: Exception | None = None, reason: str = "") -> HttpResponse:
    """handler400, and the page any 400 of the console's own renders (``reason`` says what was wrong)."""
    if isinstance(exception, RequestDataTooBig):
        reason = _too_large(request)
    return render(request, "400.html", {"reason": reason}, status=400)


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler404: the console's page, or for an API path, the API's JSON (a script parsing it got HTML)."""
    if request.path_info.startswith("/api/"):  # under whatever prefix the console is served
        return JsonResponse({"detail": f"No such API path: {request.path} (see /api/v1/docs)"}, status=404)
    return defaults.page_not_found(request, exception)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: the form was sent without a valid token, most often an expired page or
    blocked cookies. Rendering the page sets a fresh CSRF cookie, so the form works once reloaded."""
    # The path was resolved by the console's URLs before the check, so linking back to it stays here.
    return render(request, "403_csrf.html", {"back_to": request.path}, status=403)


def _too_large(request: HttpRequest) -> str:
    sent = int(request.META.get("CONTENT_LENGTH") or 0)
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return (
        f"What you sent ({filesizeformat(sent)}) is larger than the console accepts in one form "
        f"({filesizeformat(limit)}). A long script belongs in the job's data or image, not pasted into the "
        "form: go back, shorten it and send the form again."
    )
