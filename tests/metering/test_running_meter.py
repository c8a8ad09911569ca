"""A running job's meter: its closed hours are ledger rows, and the open period is a running total
the API and the job page both state (the page's "so far" figure is never a number the API lacks)."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.template import Context, Template
from django.test import Client

from metering import services
from tests.cli.inprocess import e31
from tests.metering.conftest import release, rent

pytestmark = pytest.mark.django_db

RENTED = datetime(2024, 3, 1, 9, 30, tzinfo=UTC)


@pytest.fixture
def api(member_token) -> Client:
    return Client(headers={"Authorization": f"Bearer {member_token}"})


@pytest.fixture
def running(team, node):
    allocation = rent(team=team, node=node, at=RENTED, gpus=2)
    services.accrue_meter(now=RENTED + timedelta(minutes=45))  # closes 09:30-10:00
    return allocation


def test_a_running_jobs_meter_states_its_open_period_and_total_so_far(api, running):
    with time_machine.travel(RENTED + timedelta(minutes=45), tick=False):
        body = api.get(f"/api/v1/jobs/{running.job_id}/meter").json()
    assert [e["kind"] for e in body["entries"]] == ["accrual"]
    assert body["gpu_hours"] == 1.0  # 2 GPUs x 30 min in the ledger
    assert body["holding"] is True
    assert body["open_gpu_hours"] == 0.5  # 2 GPUs x 15 min since 10:00, not a row until the hour closes
    assert body["gpu_hours_so_far"] == 1.5


def test_a_released_jobs_meter_has_no_open_period(api, running):
    release(running, at=RENTED + timedelta(hours=1))
    body = api.get(f"/api/v1/jobs/{running.job_id}/meter").json()
    assert (body["holding"], body["open_gpu_hours"], body["gpu_hours"], body["gpu_hours_so_far"]) == (
        False, 0.0, 2.0, 2.0,
    )  # fmt: skip


def test_the_job_pages_meter_card_shows_the_running_total_beside_the_ledger(running, member):
    with time_machine.travel(RENTED + timedelta(minutes=45), tick=False):
        html = Template("{% load meter %}{% job_meter job %}").render(
            Context({"job": running.job, "user": member})
        )
    assert "1.000 GPU-hours</strong> in the ledger" in html
    assert "1.500 GPU-hours held so far" in html and "0.500 in the open period" in html


def test_e31_meter_states_the_total_so_far_of_a_job_still_holding_gpus(monkeypatch, member_token, running):
    with time_machine.travel(RENTED + timedelta(minutes=45), tick=False):
        code, out, err = e31(monkeypatch, member_token, "meter", str(running.job_id))
    assert code == 0, err
    said = " ".join(out.split())  # the terminal's width may wrap the line
    assert (
        "GPU-hours: 1.0000 in the ledger; 1.5000 so far, still holding GPUs (0.5000 in the open hour)" in said
    )


def test_e31_meter_of_a_released_job_states_the_ledger_alone(monkeypatch, member_token, running):
    release(running, at=RENTED + timedelta(hours=1))
    code, out, err = e31(monkeypatch, member_token, "meter", str(running.job_id))
    assert code == 0, err
    assert "GPU-hours: 2.0000 in the ledger" in out and "so far" not in out
