"""The one guard of the operators' pages: sign-in for visitors, 404 for every other signed-in user.

A 404, not a 403: an operator page does not exist for anyone else, just as another team's job does
not, so probing reveals nothing. Every refusal is logged on the ``e31.denials`` logger with its reason.
"""

from collections.abc import Callable
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse

from common import denials


def operator_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Lets operators (is_staff) through; anyone else signed in gets 404, logged as a denial."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not request.user.is_staff:
            denials.record(request, status=404, reason="not an operator")
            raise Http404("No such page")
        return view(request, *args, **kwargs)

    return login_required(wrapped)
