"""The database refuses UPDATE and DELETE on ledger rows, on PostgreSQL and on SQLite alike.

The model refuses them too, but raw SQL, a shell or another program would not go through the
model: the trigger is what makes the ledger append-only. On PostgreSQL a CHECK also ties each
metered row's microseconds to its period exactly.

Note for later migrations: SQLite rebuilds a table to alter it, which drops its triggers;
any migration that alters this table on SQLite must re-create them.
"""

from django.db import migrations

TABLE = "metering_meterentry"

POSTGRESQL_FORWARD = [
    """
    CREATE OR REPLACE FUNCTION metering_ledger_append_only() RETURNS trigger AS $$
    BEGIN
        RAISE EXCEPTION 'the meter ledger is append-only: % refused on %', TG_OP, TG_TABLE_NAME
            USING ERRCODE = 'restrict_violation',
                  HINT = 'Corrections are new adjustment rows with a reason and an author.';
    END;
    $$ LANGUAGE plpgsql
    """,
    f"""
    CREATE TRIGGER metering_ledger_append_only
    BEFORE UPDATE OR DELETE ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION metering_ledger_append_only()
    """,
    f"""
    ALTER TABLE {TABLE} ADD CONSTRAINT meter_microseconds_match_period CHECK (
        kind = 'adjustment'
        OR microseconds = (EXTRACT(EPOCH FROM (period_end - period_start)) * 1000000)::bigint
    )
    """,
]
POSTGRESQL_REVERSE = [
    f"ALTER TABLE {TABLE} DROP CONSTRAINT IF EXISTS meter_microseconds_match_period",
    f"DROP TRIGGER IF EXISTS metering_ledger_append_only ON {TABLE}",
    "DROP FUNCTION IF EXISTS metering_ledger_append_only()",
]
SQLITE_FORWARD = [
    f"""
    CREATE TRIGGER IF NOT EXISTS metering_ledger_no_update BEFORE UPDATE ON {TABLE}
    BEGIN SELECT RAISE(ABORT, 'the meter ledger is append-only: UPDATE refused'); END
    """,
    f"""
    CREATE TRIGGER IF NOT EXISTS metering_ledger_no_delete BEFORE DELETE ON {TABLE}
    BEGIN SELECT RAISE(ABORT, 'the meter ledger is append-only: DELETE refused'); END
    """,
]
SQLITE_REVERSE = [
    "DROP TRIGGER IF EXISTS metering_ledger_no_update",
    "DROP TRIGGER IF EXISTS metering_ledger_no_delete",
]
STATEMENTS = {
    "postgresql": (POSTGRESQL_FORWARD, POSTGRESQL_REVERSE),
    "sqlite": (SQLITE_FORWARD, SQLITE_REVERSE),
}


def _run(schema_editor, *, forward: bool) -> None:
    vendor = schema_editor.connection.vendor
    if vendor not in STATEMENTS:
        raise RuntimeError(f"no append-only trigger for the {vendor} backend: the ledger needs one")
    for sql in STATEMENTS[vendor][0 if forward else 1]:
        schema_editor.execute(sql, params=None)  # no interpolation: the SQL has literal %


def install(apps, schema_editor) -> None:
    _run(schema_editor, forward=True)


def uninstall(apps, schema_editor) -> None:
    _run(schema_editor, forward=False)


class Migration(migrations.Migration):
    dependencies = [("metering", "0001_initial")]

    operations = [migrations.RunPython(install, uninstall)]
