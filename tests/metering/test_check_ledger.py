"""python manage.py check_ledger: '0 violations' on a sound ledger, exit code 1 and a list otherwise."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db.models import F

from jobs.models import Allocation
from metering import services
from metering.models import LedgerDay, LedgerJobMonth, MeterEntry
from tests.metering.conftest import T0, release, rent

pytestmark = pytest.mark.django_db


def test_a_sound_ledger_reports_zero_violations(team, node):
    release(rent(team=team, node=node, at=T0), at=T0 + timedelta(hours=3, seconds=5))
    out = StringIO()
    call_command("check_ledger", stdout=out)
    assert out.getvalue().strip().splitlines()[-1] == "0 violations"


def test_violations_are_listed_and_exit_with_code_1(team, node):
    held = rent(team=team, node=node, at=T0 - timedelta(days=2))  # beat has not closed its hours
    bypassed = rent(team=team, node=node, at=T0, name="bypassed")
    Allocation.objects.filter(id=bypassed.id).update(released_at=T0 + timedelta(hours=1))  # no meter closed
    out = StringIO()
    with pytest.raises(SystemExit) as exit_:
        call_command("check_ledger", stdout=out)
    assert exit_.value.code == 1
    lines = out.getvalue().strip().splitlines()
    assert lines[-1] == "2 violations"
    assert any(f"allocation {held.id}" in line and "closed only up to" in line for line in lines)
    assert any(f"allocation {bypassed.id}" in line and "RELEASE - RENT" in line for line in lines)


def test_a_gap_and_a_row_past_release_are_violations(team, node):
    allocation = rent(team=team, node=node, at=T0)
    release(allocation, at=T0 + timedelta(hours=3))
    first = MeterEntry.objects.filter(allocation=allocation).order_by("period_start").first()
    MeterEntry.objects.bulk_create(  # a well-formed row that overlaps the ledger and lies past RELEASE
        [
            MeterEntry(
                allocation=allocation, job_id=first.job_id, team_id=first.team_id, gpus=2, kind="accrual",
                period_start=T0 + timedelta(hours=3, minutes=1), period_end=T0 + timedelta(hours=3, minutes=2),
                microseconds=60_000_000, created_at=T0,
            )
        ]
    )  # fmt: skip
    problems = services.find_violations(now=T0 + timedelta(days=1))
    assert any("outside RENT..RELEASE" in p for p in problems)
    assert any("gap" in p for p in problems)


def test_a_summary_that_drifted_from_its_rows_is_a_violation(team, node):
    # A trigger dropped by a table rebuild, or a summary written by hand: the rows stay sound.
    allocation = rent(team=team, node=node, at=T0)
    release(allocation, at=T0 + timedelta(hours=3))
    assert services.find_violations(now=T0 + timedelta(days=1)) == []
    LedgerDay.objects.filter(team_id=team.id).update(gpu_micros=F("gpu_micros") + 1)
    LedgerJobMonth.objects.filter(job_id=allocation.job_id).delete()
    problems = services.find_violations(now=T0 + timedelta(days=1))
    assert any("metering_ledgerday" in p and str(team.id) in p for p in problems), problems
    assert any("metering_ledgerjobmonth" in p and str(allocation.job_id) in p for p in problems), problems


def test_one_gpu_held_by_two_allocations_at_once_is_a_violation(team, other_team, node):
    """Each allocation's rows tiled its own span, so two allocations metered for GPU 0 of one node over the same
    half hour, two teams paying for one GPU, read as a sound ledger. RENT cannot make such a pair (one active hold
    per GPU); the check says so if anything else ever does. A GPU handed on at the instant it is freed is not one."""
    first = rent(team=team, node=node, at=T0, gpus=1, gpu_indices=[0])
    release(first, at=T0 + timedelta(hours=1))
    handed_on = rent(
        team=other_team, node=node, at=T0 + timedelta(hours=1), gpus=1, name="next", gpu_indices=[0]
    )
    release(handed_on, at=T0 + timedelta(hours=2))
    assert services.find_violations(now=T0 + timedelta(days=1)) == []
    overlapping = rent(team=other_team, node=node, at=T0 + timedelta(minutes=90), gpus=1, name="twice",
                       gpu_indices=[0])  # fmt: skip
    release(overlapping, at=T0 + timedelta(hours=3))
    [problem] = services.find_violations(now=T0 + timedelta(days=1))
    assert f"allocation {overlapping.id}" in problem and f"allocation {handed_on.id}" in problem
    assert "GPU 0 of gpu-meter" in problem
