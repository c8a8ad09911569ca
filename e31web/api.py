"""The console's HTTP API at /api/v1 (OpenAPI docs at /api/v1/docs)."""

import json

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, Throttled, ValidationError
from ninja.parser import Parser

from accounts.api import router as accounts_router
from accounts.auth import API_AUTH, ApiThrottle
from jobs import declaration, schemas, units
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


# The browser's session is checked for a CSRF token on every method but the safe ones (ninja's SessionAuth).
CSRF_REFUSED = {
    **THROTTLED,
    "description": "Signed in by the session, but the request carried no valid CSRF token.",
}

# A body past DATA_UPLOAD_MAX_MEMORY_SIZE (on_body_too_large), read only by the methods that may carry one.
TOO_LARGE = {**THROTTLED, "description": "The request body is larger than the API reads."}

UNSAFE_METHODS = {"post", "put", "patch", "delete"}


class JobBodyInvalid(ValidationError):
    """A submitted job's body failed its schema: the 422 calls it a job, as the declaration's own errors do."""


class ConsoleApi(NinjaAPI):
    """Every operation passes the throttle first and every body the JSON parser, so each documents its 429 and
    400, and each that changes something its 403 (CSRF) and 413, whichever router added it."""

    def get_openapi_schema(self, **kwargs):
        schema = super().get_openapi_schema(**kwargs)
        for path_item in schema["paths"].values():
            for method, operation in path_item.items():
                if isinstance(operation, dict) and "responses" in operation:
                    _document_shared_errors(operation["responses"], unsafe=method in UNSAFE_METHODS)
        return schema

    def validation_error_from_error_contexts(self, error_contexts):
        error = super().validation_error_from_error_contexts(error_contexts)
        if any(_is_job_body(context.model) for context in error_contexts):
            return JobBodyInvalid(error.errors)
        return error


def _document_shared_errors(responses: dict, *, unsafe: bool) -> None:
    responses.setdefault(429, THROTTLED)
    responses.setdefault(400, BAD_REQUEST)
    if unsafe:
        responses.setdefault(403, CSRF_REFUSED)
        responses.setdefault(413, TOO_LARGE)


def _is_job_body(model) -> bool:
    """Whether ninja's parameter model is the body of a job submission (a ``JobIn``)."""
    fields = model.model_fields.values() if model.__ninja_param_source__ == "body" else ()
    return any(field.annotation is schemas.JobIn for field in fields)


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
    """A job's body is a job (its errors list says the rest); another body, a query or a path is named field by
    field, so a script setting a secret is never told its job is invalid."""
    if isinstance(exc, JobBodyInvalid):
        return "The job is not valid."
    in_body = [error for error, raw in zip(errors, exc.errors, strict=True) if _in_body(raw)]
    if in_body:
        return f"The request body is not valid: {_named(in_body)}."
    return f"The request's parameters are not valid: {_named(errors)}."


def _in_body(error: dict) -> bool:
    return tuple(error.get("loc", ()))[:1] == ("body",)


def _named(errors: list[dict]) -> str:
    """'value: input should be a valid string; name: …'; an error of the whole body has no field to name."""
    return "; ".join(
        f"{e['field']}: {_lower_first(e['message'])}" if e["field"] else _lower_first(e["message"])
        for e in errors
    )


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


@api.exception_handler(declaration.DeclarationInvalid)
def on_declaration_invalid(request: HttpRequest, exc: declaration.DeclarationInvalid):
    errors = [{"field": path, "message": message} for path, message in exc.errors]
    return api.create_response(request, {"detail": "The job is not valid.", "errors": errors}, status=422)


@api.exception_handler(RequestDataTooBig)
def on_body_too_large(request: HttpRequest, exc: RequestDataTooBig):
    """Django raises this when the body is first read, inside the operation: answered in the API's shape, not
    Django's HTML 400 page."""
    limit = units.format_size(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    detail = f"The request body is larger than the {limit} the API reads: send a smaller one."
    return api.create_response(request, {"detail": detail}, status=413)


@api.exception_handler(AuthenticationError)
def on_unauthenticated(request: HttpRequest, exc: AuthenticationError):
    problem = getattr(request, "api_auth_problem", "")
    response = api.create_response(
        request, {"detail": problem or "Authentication required: send a Bearer token."}, status=401
    )
    # RFC 6750: how to authenticate, and whether the token sent was the trouble.
    response["WWW-Authenticate"] = 'Bearer realm="E31"' + (', error="invalid_token"' if problem else "")
    return response


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
