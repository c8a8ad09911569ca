"""The console's HTTP API at /api/v1 (OpenAPI docs at /api/v1/docs)."""

from django.http import HttpRequest
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from accounts.auth import API_AUTH, ApiThrottle
from jobs import declaration
from jobs.api import router as jobs_router
from metering.api import router as metering_router

api = NinjaAPI(
    title="E31 Network console API",
    version="1",
    urls_namespace="api",
    auth=API_AUTH,
    throttle=[ApiThrottle()],
    description="Submit GPU jobs, follow them through SUBMIT → RELEASE, read the meter. "
    "Authenticate with `Authorization: Bearer <token>` (create one on the API tokens page).",
)
api.add_router("/", jobs_router)
api.add_router("/", metering_router)


def field_path(loc: tuple | list) -> str:
    """('body', 'payload', 'data', 1, 'uri') -> 'data[1].uri'."""
    parts = [p for p in loc if p not in ("body", "payload", "query", "path", "filters")]
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@api.exception_handler(ValidationError)
def on_validation_error(request: HttpRequest, exc: ValidationError):
    errors = [{"field": field_path(e.get("loc", ())), "message": e.get("msg", "invalid")} for e in exc.errors]
    return api.create_response(request, {"detail": "The job is not valid.", "errors": errors}, status=422)


@api.exception_handler(declaration.DeclarationInvalid)
def on_declaration_invalid(request: HttpRequest, exc: declaration.DeclarationInvalid):
    errors = [{"field": path, "message": message} for path, message in exc.errors]
    return api.create_response(request, {"detail": "The job is not valid.", "errors": errors}, status=422)


@api.exception_handler(AuthenticationError)
def on_unauthenticated(request: HttpRequest, exc: AuthenticationError):
    return api.create_response(
        request, {"detail": "Authentication required: send a Bearer token."}, status=401
    )


@api.exception_handler(HttpError)
def on_http_error(request: HttpRequest, exc: HttpError):
    return api.create_response(request, {"detail": str(exc)}, status=exc.status_code)
