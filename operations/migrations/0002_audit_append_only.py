"""The database refuses UPDATE and DELETE on audit entries, on PostgreSQL and on SQLite alike.

The model refuses them too, but raw SQL, a shell or the admin would not go through the model:
the trigger is what makes the audit log append-only. SQLite rebuilds a table to alter it, which
drops its triggers: a later migration that alters this table must re-create them there.
"""

from django.db import migrations

TABLE = "operations_auditentry"

POSTGRESQL_FORWARD = [
    """
    CREATE OR REPLACE FUNCTION operations_audit_append_only() RETURNS trigger AS $$
    BEGIN
        RAISE EXCEPTION 'the audit log is append-only: % refused on %', TG_OP, TG_TABLE_NAME
            USING ERRCODE = 'restrict_violation';
    END;
    $$ LANGUAGE plpgsql
    """,
    f"""
    CREATE TRIGGER operations_audit_append_only
    BEFORE UPDATE OR DELETE ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION operations_audit_append_only()
    """,
]
POSTGRESQL_REVERSE = [
    f"DROP TRIGGER IF EXISTS operations_audit_append_only ON {TABLE}",
    "DROP FUNCTION IF EXISTS operations_audit_append_only()",
]
SQLITE_FORWARD = [
    f"""
    CREATE TRIGGER IF NOT EXISTS operations_audit_no_update BEFORE UPDATE ON {TABLE}
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only: UPDATE refused'); END
    """,
    f"""
    CREATE TRIGGER IF NOT EXISTS operations_audit_no_delete BEFORE DELETE ON {TABLE}
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only: DELETE refused'); END
    """,
]
SQLITE_REVERSE = [
    "DROP TRIGGER IF EXISTS operations_audit_no_update",
    "DROP TRIGGER IF EXISTS operations_audit_no_delete",
]
STATEMENTS = {
    "postgresql": (POSTGRESQL_FORWARD, POSTGRESQL_REVERSE),
    "sqlite": (SQLITE_FORWARD, SQLITE_REVERSE),
}


def _run(schema_editor, *, forward: bool) -> None:
    vendor = schema_editor.connection.vendor
    if vendor not in STATEMENTS:
        raise RuntimeError(f"no append-only trigger for the {vendor} backend: the audit log needs one")
    for sql in STATEMENTS[vendor][0 if forward else 1]:
        schema_editor.execute(sql, params=None)  # no interpolation: the SQL has a literal %


def install(apps, schema_editor) -> None:
    _run(schema_editor, forward=True)


def uninstall(apps, schema_editor) -> None:
    _run(schema_editor, forward=False)


class Migration(migrations.Migration):
    dependencies = [("operations", "0001_initial")]

    operations = [migrations.RunPython(install, uninstall)]
