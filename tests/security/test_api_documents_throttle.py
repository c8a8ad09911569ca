"""Every API operation passes the throttle first, so every one documents the 429 it may answer; every one that
changes something also documents the session's CSRF 403 and the 413 of a body too large to read."""

import json

import pytest
from django.test import Client

from jobs.models import Job

pytestmark = pytest.mark.django_db


def operations(client) -> list[tuple[str, str, dict]]:
    schema = client.get("/api/v1/openapi.json").json()
    return [(path, method, op) for path, item in schema["paths"].items() for method, op in item.items()]


def test_every_operation_in_the_schema_documents_429(client):
    listed = operations(client)
    assert len(listed) > 15  # every router of the console, not an empty schema
    missing = [f"{method.upper()} {path}" for path, method, op in listed if "429" not in op["responses"]]
    assert not missing, missing


def test_every_operation_that_changes_something_documents_403_and_413(client):
    """A client generated from the schema has a branch for the CSRF refusal a signed-in browser may get and for a
    body past the upload limit, on every POST, PUT and DELETE."""
    unsafe = [(path, method, op) for path, method, op in operations(client) if method != "get"]
    assert len(unsafe) > 5
    missing = [
        f"{method.upper()} {path}"
        for path, method, op in unsafe
        if not {"403", "413"} <= set(op["responses"])
    ]
    assert not missing, missing


def test_a_session_post_without_a_csrf_token_is_refused_with_the_documented_403(member, roots, pool):
    """A page (or another site's form) POSTs a job with the member's session cookie and no CSRF token: it is
    refused with 403, and POST /api/v1/jobs documents that 403."""
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(member)
    body = {
        "name": "sweep",
        "work": {"argv": ["python3", "train.py"]},
        "request": {"gpus": 1, "hours": 1.0},
        "output": {"uri": f"file://{roots[1]}/sweep", "bytes": 1000},
    }
    response = browser.post("/api/v1/jobs", json.dumps(body), content_type="application/json")
    assert response.status_code == 403 and not Job.objects.exists()
    [submit] = [op for path, method, op in operations(Client()) if (path, method) == ("/api/v1/jobs", "post")]
    assert "403" in submit["responses"]
