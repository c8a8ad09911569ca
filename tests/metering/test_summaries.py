"""The ledger's summary tables always equal the sums of its rows: kept by a trigger, in the same transaction."""

from collections import defaultdict
from datetime import timedelta

import pytest
from django.db import connection

from metering import services, summaries
from metering.models import LedgerDay, LedgerJobMonth, MeterEntry
from tests.metering.conftest import T0, release, rent

pytestmark = pytest.mark.django_db


def sums_of_the_rows() -> tuple[dict, dict]:
    days, months = defaultdict(int), defaultdict(lambda: [0, 0])
    for row in MeterEntry.objects.all():
        days[(row.team_id, row.period_start.date())] += row.gpus * row.microseconds
        months[(row.job_id, row.period_start.date().replace(day=1))][row.kind == "adjustment"] += (
            row.gpus * row.microseconds
        )
    return dict(days), {k: tuple(v) for k, v in months.items()}


def summaries_now() -> tuple[dict, dict]:
    days = {(d.team_id, d.day): d.gpu_micros for d in LedgerDay.objects.all()}
    months = {(m.job_id, m.month): (m.metered, m.adjusted) for m in LedgerJobMonth.objects.all()}
    return days, months


def test_accrual_release_and_adjustments_keep_the_summaries_equal_to_the_rows(
    team, other_team, node, operator
):
    # Across a day and a month boundary, two teams, one allocation still held.
    a = rent(team=team, node=node, at=T0.replace(day=31, month=3, hour=20))
    b = rent(team=other_team, node=node, at=T0, gpus=3)
    services.accrue_meter(now=T0.replace(day=31, month=3, hour=23, minute=30))
    release(a, at=T0.replace(month=4, day=1, hour=2, minute=7))
    services.accrue_meter(now=T0 + timedelta(hours=30))
    services.adjust_meter(allocation_id=a.id, microseconds=-5_000_000, reason="credit", author=operator,
                          now=T0.replace(month=4, day=2))  # fmt: skip
    assert summaries_now() == sums_of_the_rows()
    assert LedgerJobMonth.objects.filter(job_id=b.job_id).count() == 1


def test_rows_skipped_as_duplicates_add_nothing(team, node):
    a = rent(team=team, node=node, at=T0)
    services.accrue_meter(now=T0 + timedelta(hours=5))
    before = summaries_now()
    services.accrue_meter(now=T0 + timedelta(hours=5))  # offers the same hours again: ON CONFLICT DO NOTHING
    services.close_meter(allocation_id=a.id, released_at=T0 + timedelta(hours=4, minutes=59, seconds=59))
    assert summaries_now() != before  # the final row was new
    services.close_meter(allocation_id=a.id, released_at=T0 + timedelta(hours=4, minutes=59, seconds=59))
    assert summaries_now() == sums_of_the_rows()


def test_a_rebuild_gives_what_the_trigger_kept(team, node):
    a = rent(team=team, node=node, at=T0)
    release(a, at=T0 + timedelta(days=2, minutes=3))
    kept = summaries_now()
    with connection.cursor() as cursor:
        for sql in summaries.rebuild_sql(connection.vendor):
            cursor.execute(sql)
    assert summaries_now() == kept == sums_of_the_rows()
