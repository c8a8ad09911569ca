"""/healthz: the load balancer's liveness probe. It touches no database, so a slow query never
takes a healthy web process out of rotation, and it is the floor the web bench measures against."""

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe


@never_cache
@require_safe
def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", content_type="text/plain")
