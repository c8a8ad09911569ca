"""Schemathesis over the whole /api/v1 OpenAPI schema, in-process: no server error, no answer off the schema.

Every operation gets data that fits its schema (positive) and data that does not (negative),
sent with a member's Bearer token. Some examples are steered to real objects (the member's own
job, valid data and output URIs) so the success responses are checked against the schema too,
not only the refusals.
"""

import uuid
from collections import Counter
from datetime import UTC, datetime

import pytest
import schemathesis
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from e31web.celery import app as celery_app
from e31web.wsgi import application
from metering.models import MeterEntry
from tests.factories import JobFactory

# Requests go through the real WSGI handler, which closes connections between requests as in
# production: each example commits for real, so the test uses a transactional database.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]

CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance, content_type_conformance]
EXAMPLES = {GenerationMode.POSITIVE: 60, GenerationMode.NEGATIVE: 40}  # per operation


@pytest.fixture
def schema(transactional_db):
    return schemathesis.openapi.from_wsgi("/api/v1/openapi.json", application)


@pytest.fixture(autouse=True)
def _own_queue(settings):
    """Accepted submissions ring for staging after commit: on a queue of this test's, deleted after."""
    settings.CELERY_TASK_DEFAULT_QUEUE = f"hostile-{uuid.uuid4().hex[:8]}"
    yield
    with celery_app.connection_for_write() as conn:
        conn.default_channel.queue_delete(settings.CELERY_TASK_DEFAULT_QUEUE)


@pytest.fixture
def own_job(team, pool):
    """A released job of the member's team with a meter row, so reads have something real to return."""
    job = JobFactory(team=team, state="released", end_reason="succeeded", attempt=1)
    start = datetime(2026, 1, 5, 9, tzinfo=UTC)
    allocation = job.allocations.create(
        attempt=1, node=pool[0], gpu_indices=[0], rented_at=start, released_at=start.replace(minute=30)
    )
    MeterEntry.objects.create(
        allocation=allocation, job=job, team=team, period_start=start, period_end=start.replace(minute=30),
        gpus=1, microseconds=1_800_000_000, kind="final", created_at=timezone.now(),
    )  # fmt: skip
    return job


def _steer(case, draw, *, job_id: int, roots) -> None:
    """Half the time, point the example at real objects so it can succeed."""
    if not draw(st.booleans()):
        return
    if "job_id" in (case.path_parameters or {}):
        case.path_parameters["job_id"] = job_id
    body = case.body if isinstance(case.body, dict) else None
    if body and isinstance(body.get("output"), dict) and isinstance(body.get("request"), dict):
        # What a random example cannot know (the pool, the roots, the team) and what it rarely hits
        # (a program name); the generated arguments, image and workdir stay as they were drawn.
        body.update(team="", data=[], name=draw(st.sampled_from(["fuzz", "ünïcode job", "x" * 120])))
        work = body["work"] if isinstance(body.get("work"), dict) else {}
        args = [a for a in work.get("argv") or [] if isinstance(a, str) and "\0" not in a][:3]
        body["work"] = {**work, "argv": ["/usr/bin/true", *args], "env": {}}
        body["output"].update(uri=f"file://{roots[1]}/{draw(st.sampled_from(['out', 'a/b', 'ü']))}", bytes=1)
        body["request"].update(gpus=draw(st.integers(1, 8)), hours=0.5, min_gpus=None, gpu_model="")
    if case.query is not None and "start" in case.query:
        case.query.update(start="2026-01-01", end=draw(st.sampled_from(["2026-01-31", "2025-12-31"])))


def _explore(operation, mode, *, token: str, job_id: int, roots, tried: Counter) -> list[str]:
    failures: list[str] = []

    @settings(
        max_examples=EXAMPLES[mode], deadline=None, database=None, derandomize=True,
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @given(case=operation.as_strategy(generation_mode=mode), draw=st.data())
    def run(case, draw) -> None:
        tried[operation.label] += 1
        _steer(case, draw.draw, job_id=job_id, roots=roots)
        response = case.call(headers={"Authorization": f"Bearer {token}"})
        tried[f"{operation.label} -> {response.status_code}"] += 1
        case.validate_response(response, checks=CHECKS, headers={"Authorization": f"Bearer {token}"})

    try:
        run()
    except Exception as exc:  # hypothesis re-raises the smallest failing example: record it, go on
        failures.append(f"{operation.label} ({mode.value}): {exc}")
    return failures


def test_no_operation_answers_with_a_server_error_or_off_its_schema(schema, member_token, own_job, roots):
    tried: Counter = Counter()
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in EXAMPLES:
            failures += _explore(
                operation, mode, token=member_token, job_id=own_job.id, roots=roots, tried=tried
            )
    operations = sorted(k for k in tried if "->" not in k)
    print(f"\nschemathesis: {sum(tried[k] for k in operations)} examples over {len(operations)} operations")
    for key in sorted(tried):
        print(f"  {tried[key]:5d}  {key}")
    assert not failures, "\n\n".join(failures)
    assert any(k.startswith("POST /api/v1/jobs -> 201") for k in tried), "no submission ever succeeded"
