"""Ledger rows are never updated or deleted: the model refuses, and so does the database."""

import sqlite3
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction

from common import append_only
from metering import services
from metering.models import LedgerIsAppendOnly, MeterEntry
from tests.factories import UserFactory
from tests.metering.conftest import T0, release, rent

pytestmark = pytest.mark.django_db


@pytest.fixture
def entry(team, node) -> MeterEntry:
    allocation = rent(team=team, node=node, at=T0)
    release(allocation, at=T0 + timedelta(hours=2))
    return MeterEntry.objects.order_by("period_start").first()


def test_saving_a_changed_row_is_refused(entry):
    entry.microseconds += 1
    with pytest.raises(LedgerIsAppendOnly):
        entry.save()


def test_deleting_a_row_is_refused(entry):
    with pytest.raises(LedgerIsAppendOnly):
        entry.delete()


@pytest.mark.parametrize(
    "change",
    [
        lambda rows: rows.update(microseconds=1),
        lambda rows: rows.delete(),
        lambda rows: rows.bulk_update(list(rows), ["microseconds"]),
    ],
    ids=["update", "delete", "bulk_update"],
)
def test_queryset_updates_and_deletes_are_refused(entry, change):
    with pytest.raises(LedgerIsAppendOnly):
        change(MeterEntry.objects.all())


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE metering_meterentry SET microseconds = microseconds + 1 WHERE id = %s",
        "DELETE FROM metering_meterentry WHERE id = %s",
    ],
    ids=["UPDATE", "DELETE"],
)
def test_raw_sql_updates_and_deletes_are_refused_by_the_trigger(entry, sql):
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql, [entry.id])
    assert MeterEntry.objects.filter(id=entry.id, microseconds=entry.microseconds).exists()


def test_the_database_refuses_a_metered_row_whose_seconds_do_not_match_its_period(entry):
    wrong = MeterEntry(
        allocation_id=entry.allocation_id, job_id=entry.job_id, team_id=entry.team_id,
        period_start=entry.period_start - timedelta(days=1), period_end=entry.period_start - timedelta(hours=23),
        gpus=entry.gpus, microseconds=3_599_999_999, kind="accrual", created_at=T0,
    )  # fmt: skip
    with pytest.raises(IntegrityError), transaction.atomic():
        wrong.save()


def test_the_database_refuses_a_second_metered_row_for_the_same_period(entry):
    duplicate = MeterEntry(
        allocation_id=entry.allocation_id, job_id=entry.job_id, team_id=entry.team_id,
        period_start=entry.period_start, period_end=entry.period_end, gpus=entry.gpus,
        microseconds=entry.microseconds, kind="accrual", created_at=T0,
    )  # fmt: skip
    with pytest.raises(IntegrityError), transaction.atomic():
        duplicate.save()


def test_a_correction_is_a_new_adjustment_row_with_reason_and_author(entry):
    operator = UserFactory(username="ops", is_staff=True)
    before = list(MeterEntry.objects.values_list("id", "microseconds"))
    [adjustment] = services.adjust_meter(
        allocation_id=entry.allocation_id, microseconds=-60_000_000, reason="agent clock skew", author=operator,
        now=T0 + timedelta(days=1),
    )  # fmt: skip
    assert (adjustment.kind, adjustment.reason, adjustment.created_by) == (
        "adjustment",
        "agent clock skew",
        operator,
    )
    assert list(MeterEntry.objects.exclude(id=adjustment.id).values_list("id", "microseconds")) == before
    assert services.find_violations(now=T0 + timedelta(days=1)) == []


def test_an_adjustment_without_a_reason_or_by_a_member_is_refused(entry, member):
    with pytest.raises(ValueError, match="an adjustment needs a reason and a non-zero amount"):
        services.adjust_meter(
            allocation_id=entry.allocation_id, microseconds=5, reason=" ", author=member, now=T0
        )
    with pytest.raises(PermissionError):
        services.adjust_meter(
            allocation_id=entry.allocation_id, microseconds=5, reason="why", author=member, now=T0
        )


def test_a_credit_larger_than_the_metered_time_is_refused(entry):
    operator = UserFactory(username="ops", is_staff=True)
    with pytest.raises(
        ValueError, match="this credit is larger than the GPU-time the allocation was metered"
    ):
        services.adjust_meter(
            allocation_id=entry.allocation_id, microseconds=-3 * 3_600_000_000, reason="too much",
            author=operator, now=T0,
        )  # fmt: skip


def test_a_charge_past_the_time_the_allocation_held_is_refused(entry):
    """An operator walk: 3,600,000 typed in "seconds per GPU" (hours typed as seconds) charged a job that held its
    GPUs 137 s for 4,000 GPU-hours, blowing its team's enforced budget. No allocation is charged more than it held:
    RENT to RELEASE, on each of its GPUs."""
    operator = UserFactory(username="ops", is_staff=True)
    hour = 3_600_000_000
    with pytest.raises(ValueError, match="more than the allocation held"):
        services.adjust_meter(
            allocation_id=entry.allocation_id, microseconds=1_000 * hour, reason="typo", author=operator, now=T0
        )  # fmt: skip
    services.adjust_meter(
        allocation_id=entry.allocation_id, microseconds=-hour, reason="skew", author=operator, now=T0
    )
    services.adjust_meter(
        allocation_id=entry.allocation_id, microseconds=hour, reason="undo", author=operator, now=T0
    )
    with pytest.raises(ValueError, match="more than the allocation held"):
        services.adjust_meter(
            allocation_id=entry.allocation_id, microseconds=1, reason="past it", author=operator, now=T0
        )  # fmt: skip


def test_the_sqlite_triggers_refuse_update_and_delete_too():
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE metering_meterentry (id INTEGER PRIMARY KEY, microseconds INTEGER)")
    for sql in append_only._statements(
        "sqlite",
        table="metering_meterentry",
        what="the meter ledger",
        events=("UPDATE", "DELETE"),
        forward=True,
    ):
        db.execute(sql)
    db.execute("INSERT INTO metering_meterentry (microseconds) VALUES (5)")
    for sql in ("UPDATE metering_meterentry SET microseconds = 6", "DELETE FROM metering_meterentry"):
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            db.execute(sql)
    assert db.execute("SELECT microseconds FROM metering_meterentry").fetchall() == [(5,)]
