"""`e31 ledger`: a month's rows and GPU-hours, and what it says when the month holds more than it reads."""

from datetime import UTC, datetime, timedelta

import pytest

from e31cli import main
from tests.cli.inprocess import e31
from tests.factories import NodeFactory
from tests.metering.conftest import release, rent

pytestmark = pytest.mark.django_db


def _three_jobs_in_may(team) -> None:
    node = NodeFactory(name="gpu-cli", gpus=8)
    for n in range(3):
        began = datetime(2024, 5, 6, 1, tzinfo=UTC) + timedelta(hours=n)
        release(rent(team=team, node=node, at=began, gpus=1, name=f"j{n}"), at=began + timedelta(minutes=30))


def test_the_ledger_command_totals_the_months_rows(monkeypatch, member_token, team):
    _three_jobs_in_may(team)
    code, stdout, stderr = e31(monkeypatch, member_token, "ledger", "--month", "2024-05")
    assert code == 0, stderr
    assert "May 2024: 3 rows, 1.5000 GPU-hours" in stdout


def test_a_month_past_the_rows_the_command_reads_is_said_not_totalled_silently(
    monkeypatch, member_token, team
):
    """It read at most 100,000 rows and printed their total as the month's, with no word of the rest."""
    _three_jobs_in_may(team)
    monkeypatch.setattr(main, "LEDGER_ROWS", 2)
    code, stdout, stderr = e31(monkeypatch, member_token, "ledger", "--month", "2024-05")
    assert code == 0, stderr
    assert "May 2024: the first 2 rows, 1.0000 GPU-hours" in stdout
    assert "the month has more" in stdout and "/ledger/export.csv?start=2024-05-01&end=2024-05-31" in stdout
