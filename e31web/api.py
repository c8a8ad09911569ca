"""The console's HTTP API at /api/v1 (OpenAPI docs at /api/v1/docs)."""

import json

from django.http import HttpRequest
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, Throttled, ValidationError
from ninja.parser import Parser

from accounts.api import router as accounts_router
from accounts.auth import API_AUTH, ApiThrottle
from jobs import declaration
from jobs.api import router as jobs_router
from metering.api import router as metering_router
from notifications.api import router as notifications_router


class BodyTooDeep(ValueError):
    pass


class JsonParser(Parser):
    """JSON bodies nested no deeper than a declaration can be: ``[[[…]]]`` is refused, never recursed into."""

    def parse_body(self, request: HttpRequest):
        try:
            body = json.loads(request.body)
        except RecursionError as exc:
            raise BodyTooDeep(_too_deep()) from exc
        if declaration.nesting_depth(body) > declaration.MAX_NESTING:
            raise BodyTooDeep(_too_deep())
        return body


def _too_deep() -> str:
    return f"nested too deeply: at most {declaration.MAX_NESTING} levels of lists and objects"


THROTTLED = {
    "description": "Too many requests: ask again after Retry-After seconds.",
    "content": {"application/json": {"schema": {
        "type": "object", "properties": {"detail": {"type": "string"}}, "required": ["detail"],
    }}},
}  # fmt: skip


# A NUL character in the path or query (common.nul), or a body that is not JSON: any operation may answer it.
BAD_REQUEST = {
    **THROTTLED,
    "description": "The request could not be read: a NUL character, or a body that is not JSON.",
}


class ConsoleApi(NinjaAPI):
    """Every operation passes the throttle first and every body the JSON parser, so each documents its 429 (and
    400 where it takes a body), whichever router added it."""

    def get_openapi_schema(self, **kwargs):
        schema = super().get_openapi_schema(**kwargs)
        for path_item in schema["paths"].values():
            for operation in path_item.values():
                if isinstance(operation, dict) and "responses" in operation:
                    operation["responses"].setdefault(429, THROTTLED)
                    operation["responses"].setdefault(400, BAD_REQUEST)
        return schema


api = ConsoleApi(
    parser=JsonParser(),
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
api.add_router("/", notifications_router)
api.add_router("/", accounts_router)


def field_path(loc: tuple | list) -> str:
    """('body', 'payload', 'data', 1, 'uri') -> 'data[1].uri'."""
    parts = [p for p in loc if p not in ("body", "payload", "query", "path", "filters")]
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@api.exception_handler(ValidationError)
def on_validation_error(request: HttpRequest, exc: ValidationError):
    errors = [{"field": field_path(e.get("loc", ())), "message": _message(e)} for e in exc.errors]
    return api.create_response(request, {"detail": _what_is_wrong(exc, errors), "errors": errors}, status=422)


def _message(error: dict) -> str:
    """pydantic's message, but a job's unknown field as the job file's rules say it (with the key it may mean)."""
    loc = [p for p in error.get("loc", ()) if p not in ("body", "payload")]
    if error.get("type") == "extra_forbidden" and loc:
        part = next((p for p in reversed(loc[:-1]) if isinstance(p, str)), "")
        if part in declaration.KNOWN_KEYS:
            return declaration.unknown_key(part, str(loc[-1]))
    return error.get("msg", "invalid")


def _what_is_wrong(exc: ValidationError, errors: list[dict]) -> str:
    """A body is a job; anything else (a query, a path) is named with its parameters."""
    if any(tuple(e.get("loc", ()))[:1] == ("body",) for e in exc.errors):
        return "The job is not valid."
    named = "; ".join(f"{e['field']}: {_lower_first(e['message'])}" for e in errors)
    return f"The request's parameters are not valid: {named}."


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


@api.exception_handler(declaration.DeclarationInvalid)
def on_declaration_invalid(request: HttpRequest, exc: declaration.DeclarationInvalid):
    errors = [{"field": path, "message": message} for path, message in exc.errors]
    return api.create_response(request, {"detail": "The job is not valid.", "errors": errors}, status=422)


@api.exception_handler(AuthenticationError)
def on_unauthenticated(request: HttpRequest, exc: AuthenticationError):
    detail = getattr(request, "api_auth_problem", "") or "Authentication required: send a Bearer token."
    return api.create_response(request, {"detail": detail}, status=401)


@api.exception_handler(HttpError)
def on_http_error(request: HttpRequest, exc: HttpError):
    detail = str(exc)
    if isinstance(exc.__cause__, BodyTooDeep | json.JSONDecodeError):  # say why the body could not be read
        detail = f"{detail}: {exc.__cause__}"
    response = api.create_response(request, {"detail": detail}, status=exc.status_code)
    if (
        isinstance(exc, Throttled) and exc.wait is not None
    ):  # raised by authentication, past the throttle hook
        response["Retry-After"] = str(exc.wait)
    return response
