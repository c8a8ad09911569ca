"""Every API operation passes the throttle first, so every one documents the 429 it may answer."""

import pytest

pytestmark = pytest.mark.django_db


def test_every_operation_in_the_schema_documents_429(client):
    schema = client.get("/api/v1/openapi.json").json()
    operations = [(path, method, op) for path, item in schema["paths"].items() for method, op in item.items()]
    assert len(operations) > 15  # every router of the console, not an empty schema
    missing = [f"{method.upper()} {path}" for path, method, op in operations if "429" not in op["responses"]]
    assert not missing, missing
