"""Database triggers that refuse UPDATE and/or DELETE on a table, on PostgreSQL and SQLite alike.

Models refuse such writes too, but raw SQL, a shell or another program would not go through the
model: the trigger is what makes a record (ledger, audit log, public history) append-only.
SQLite rebuilds a table to alter it, which drops its triggers: a later migration that alters
such a table must re-create them there.
"""

from django.db import migrations


def _statements(vendor: str, *, table: str, what: str, events: tuple[str, ...], forward: bool) -> list[str]:
    name = f"{table}_append_only"
    if vendor == "postgresql":
        if not forward:
            return [f"DROP TRIGGER IF EXISTS {name} ON {table}", f"DROP FUNCTION IF EXISTS {name}()"]
        return [
            f"""CREATE OR REPLACE FUNCTION {name}() RETURNS trigger AS $$
            BEGIN
                RAISE EXCEPTION '{what} is append-only: % refused on %', TG_OP, TG_TABLE_NAME
                    USING ERRCODE = 'restrict_violation';
            END; $$ LANGUAGE plpgsql""",
            f"CREATE TRIGGER {name} BEFORE {' OR '.join(events)} ON {table} FOR EACH ROW EXECUTE FUNCTION {name}()",
        ]
    if vendor == "sqlite":
        if not forward:
            return [f"DROP TRIGGER IF EXISTS {name}_{event.lower()}" for event in events]
        return [
            f"CREATE TRIGGER IF NOT EXISTS {name}_{event.lower()} BEFORE {event} ON {table} "
            f"BEGIN SELECT RAISE(ABORT, '{what} is append-only: {event} refused'); END"
            for event in events
        ]
    raise RuntimeError(f"no append-only trigger for the {vendor} backend: {what} needs one")


def refuse_changes(
    table: str, *, what: str, events: tuple[str, ...] = ("UPDATE", "DELETE")
) -> migrations.RunPython:
    """A migration operation installing the trigger (and removing it when reversed)."""

    def run(forward: bool):
        def apply(apps, schema_editor) -> None:
            vendor = schema_editor.connection.vendor
            for sql in _statements(vendor, table=table, what=what, events=events, forward=forward):
                schema_editor.execute(sql, params=None)  # no interpolation: the SQL holds a literal %

        return apply

    return migrations.RunPython(run(True), run(False))
