"""The database refuses UPDATE and DELETE on ledger rows, on PostgreSQL and on SQLite alike.

The model refuses them too, but raw SQL, a shell or another program would not go through the
model: the trigger is what makes the ledger append-only. On PostgreSQL a CHECK also ties each
metered row's microseconds to its period exactly.

Note for later migrations: SQLite rebuilds a table to alter it, which drops its triggers;
any migration that alters this table on SQLite must re-create them.
"""

from django.db import migrations

from common.append_only import refuse_changes

TABLE = "metering_meterentry"

# PostgreSQL also ties each metered row's microseconds to its period exactly.
PERIOD_CHECK = f"""
    ALTER TABLE {TABLE} ADD CONSTRAINT meter_microseconds_match_period CHECK (
        kind = 'adjustment'
        OR microseconds = (EXTRACT(EPOCH FROM (period_end - period_start)) * 1000000)::bigint
    )
"""


def add_period_check(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PERIOD_CHECK, params=None)


def drop_period_check(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT IF EXISTS meter_microseconds_match_period")


class Migration(migrations.Migration):
    dependencies = [("metering", "0001_initial")]

    operations = [
        refuse_changes(TABLE, what="the meter ledger"),
        migrations.RunPython(add_period_check, drop_period_check),
    ]
