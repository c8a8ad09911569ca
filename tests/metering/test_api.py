"""/api/v1/jobs/{id}/meter and /api/v1/ledger: scoped like the pages; another team's data is a 404."""

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from accounts import services as accounts
from metering import services
from tests.metering.conftest import release, rent

pytestmark = pytest.mark.django_db

RENTED = datetime(2024, 2, 29, 22, 30, tzinfo=UTC)


@pytest.fixture
def api(member_token) -> Client:
    return Client(headers={"Authorization": f"Bearer {member_token}"})


@pytest.fixture
def jobs(team, other_team, node):
    mine = rent(team=team, node=node, at=RENTED, gpus=2)
    release(mine, at=RENTED + timedelta(hours=2, minutes=15))
    theirs = rent(team=other_team, node=node, at=RENTED, gpus=1, name="theirs")
    release(theirs, at=RENTED + timedelta(hours=1))
    return mine.job, theirs.job


def test_a_jobs_meter_lists_its_rows_and_gpu_hours(api, jobs):
    body = api.get(f"/api/v1/jobs/{jobs[0].id}/meter").json()
    assert [(e["period_start"], e["seconds"], e["kind"]) for e in body["entries"]] == [
        ("2024-02-29T22:30:00Z", 1800.0, "accrual"),
        ("2024-02-29T23:00:00Z", 3600.0, "accrual"),
        ("2024-03-01T00:00:00Z", 2700.0, "final"),
    ]
    assert body["entries"][0]["gpus"] == 2 and body["entries"][0]["microseconds"] == 1_800_000_000
    assert body["gpu_hours"] == 4.5


def test_another_teams_job_meter_is_a_404_and_no_token_is_a_401(api, jobs):
    assert api.get(f"/api/v1/jobs/{jobs[1].id}/meter").status_code == 404
    assert Client().get(f"/api/v1/jobs/{jobs[0].id}/meter").status_code == 401


def test_the_ledger_is_paginated_and_scoped_to_the_members_team(api, jobs):
    body = api.get("/api/v1/ledger", {"start": "2024-02-29", "end": "2024-03-01", "limit": 2}).json()
    assert body["count"] == 3 and len(body["items"]) == 2
    assert {item["team"] for item in body["items"]} == {"vision"}
    rest = api.get("/api/v1/ledger", {"start": "2024-02-29", "end": "2024-03-01", "offset": 2}).json()
    assert [item["kind"] for item in rest["items"]] == ["final"]
    assert api.get("/api/v1/ledger", {"start": "2024-03-01", "end": "2024-03-01"}).json()["count"] == 1


def test_another_teams_ledger_is_a_404(api, jobs):
    response = api.get("/api/v1/ledger", {"start": "2024-02-01", "end": "2024-03-31", "team": "audio"})
    assert response.status_code == 404


def test_malformed_or_reversed_dates_are_a_422(api, jobs):
    assert api.get("/api/v1/ledger", {"start": "29/02/2024", "end": "2024-03-01"}).status_code == 422
    assert api.get("/api/v1/ledger", {"start": "2024-03-02", "end": "2024-03-01"}).status_code == 422
    assert api.get("/api/v1/ledger", {"start": "2024-03-01"}).status_code == 422


def test_a_range_ending_on_the_calendars_last_day_is_a_422_not_a_500(api, jobs):
    response = api.get("/api/v1/ledger", {"start": "9999-12-31", "end": "9999-12-31"})
    assert response.status_code == 422
    assert response.json()["detail"] == "Bad date range: the end date must be before 9999-12-31."


def test_an_operator_reads_any_teams_ledger(operator, jobs):
    _, token = accounts.create_api_token(user=operator, label="ops")
    client = Client(headers={"Authorization": f"Bearer {token}"})
    body = client.get("/api/v1/ledger", {"start": "2024-02-29", "end": "2024-03-01"}).json()
    assert {item["team"] for item in body["items"]} == {"vision", "audio"}
    assert client.get(f"/api/v1/jobs/{jobs[1].id}/meter").status_code == 200


def test_the_openapi_schema_documents_the_error_responses(api):
    paths = api.get("/api/v1/openapi.json").json()["paths"]
    for path in ("/api/v1/jobs/{job_id}/meter", "/api/v1/ledger"):
        assert {"200", "401", "404", "422"} <= set(paths[path]["get"]["responses"])
        assert paths[path]["get"]["tags"] == ["meter"]


def test_adjustments_appear_in_the_jobs_meter(api, jobs, operator):
    allocation = jobs[0].allocations.get()
    services.adjust_meter(
        allocation_id=allocation.id, microseconds=-900_000_000, reason="credit", author=operator, now=RENTED
    )
    body = api.get(f"/api/v1/jobs/{jobs[0].id}/meter").json()
    assert body["entries"][-1]["kind"] == "adjustment" and body["gpu_hours"] == 4.0
