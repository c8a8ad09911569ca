"""One append-only QuerySet for the ledger, the audit log and the public record: each refuses every change."""

from datetime import UTC, datetime

import pytest
from django.db import IntegrityError, connection, transaction

from common.append_only import ALLOW_TRUNCATE, AppendOnlyError
from metering.models import LedgerIsAppendOnly, MeterEntry
from operations.models import AuditEntry, AuditIsAppendOnly
from public.models import IntakeChange, Measurement, ProblemRevision

pytestmark = pytest.mark.django_db
AT = datetime(2026, 11, 2, tzinfo=UTC)

CHANGES = {
    "update": lambda rows: rows.update(id=1),
    "delete": lambda rows: rows.delete(),
    "bulk_update": lambda rows: rows.bulk_update([], ["id"]),
    "update_or_create": lambda rows: rows.update_or_create(id=1, defaults={}),
}


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
@pytest.mark.parametrize("model", [MeterEntry, AuditEntry, ProblemRevision, Measurement, IntakeChange])
def test_every_append_only_model_refuses_every_bulk_change(model, change):
    with pytest.raises(AppendOnlyError):
        change(model.objects.all())


def test_each_record_keeps_its_own_error_type_and_says_what_to_do_instead():
    with pytest.raises(LedgerIsAppendOnly, match="ledger rows are never updated; append an adjustment"):
        MeterEntry.objects.update_or_create(id=1, defaults={})
    with pytest.raises(AuditIsAppendOnly, match="audit entries are never deleted"):
        AuditEntry.objects.all().delete()


def test_a_saved_row_is_never_saved_again():
    row = IntakeChange.objects.create(is_open=True, at=AT, by="olga")
    row.is_open = False
    with pytest.raises(AppendOnlyError, match="IntakeChange rows are never updated"):
        row.save()
    with pytest.raises(AppendOnlyError, match="never deleted"):
        row.delete()
    assert IntakeChange.objects.get(id=row.id).is_open is True


APPEND_ONLY_TABLES = [
    "metering_meterentry", "operations_auditentry", "e31web_problemrevision", "e31web_measurement",
    "e31web_intakechange",
]  # fmt: skip


@pytest.mark.parametrize("table", APPEND_ONLY_TABLES)
def test_the_database_refuses_to_truncate_an_append_only_table(table):
    """Row triggers never fire on TRUNCATE: it emptied the ledger as the application's role, where DELETE was
    refused. The test suite's flush alone may (common.append_only.ALLOW_TRUNCATE, set for its transaction)."""
    with (
        pytest.raises(IntegrityError, match=f"append-only: TRUNCATE refused on {table}"),
        transaction.atomic(),
    ):
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {table} CASCADE")


def test_a_transaction_that_allows_it_may_truncate():
    """What the test suite's flush does between transactional tests, and only it."""
    IntakeChange.objects.create(is_open=True, at=AT, by="olga")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(ALLOW_TRUNCATE)
        cursor.execute("TRUNCATE e31web_intakechange")
    assert not IntakeChange.objects.exists()
