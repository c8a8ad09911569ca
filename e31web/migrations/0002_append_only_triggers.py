"""PostgreSQL refuses, for writes that bypass the models, what the models already refuse.

Revisions, measurements and intake changes are never updated or deleted; problems are never
deleted. SQLite (the embedded default) relies on the models' own refusal. TRUNCATE (the test
suite's flush) does not fire row triggers, so tests can still reset the tables.
"""

from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION e31web_refuse_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% on %: the public record keeps this row as written', TG_OP, TG_TABLE_NAME;
END;
$$ LANGUAGE plpgsql;
"""

TRIGGERS = {
    "e31web_problemrevision": "UPDATE OR DELETE",
    "e31web_measurement": "UPDATE OR DELETE",
    "e31web_intakechange": "UPDATE OR DELETE",
    "e31web_problem": "DELETE",
}


def create(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(FUNCTION, params=None)  # None: the % in RAISE is not a placeholder
    for table, events in TRIGGERS.items():
        schema_editor.execute(
            f"CREATE TRIGGER {table}_keep BEFORE {events} ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION e31web_refuse_change();"
        )


def drop(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in TRIGGERS:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_keep ON {table};")
    schema_editor.execute("DROP FUNCTION IF EXISTS e31web_refuse_change();")


class Migration(migrations.Migration):
    dependencies = [("e31web", "0001_initial")]

    operations = [migrations.RunPython(create, drop)]
