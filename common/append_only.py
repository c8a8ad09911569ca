"""Append-only rows (ledger, audit log, public history): one model base, one QuerySet, one trigger.

The model and its QuerySet refuse every write that would change or remove a row, with a clear error
before any SQL. Raw SQL, a shell or another program would not go through the model: the database
trigger installed by ``refuse_changes`` is what makes the record append-only. SQLite rebuilds a
table to alter it, which drops its triggers: a later migration that alters such a table must
re-create them there.
"""

from typing import ClassVar, NoReturn

from django.db import migrations, models


class AppendOnlyError(Exception):
    """A write that would change or remove a row the record promises to keep."""


def refusal(model: type[models.Model], verb: str) -> AppendOnlyError:
    error = getattr(model, "append_only_error", AppendOnlyError)
    noun = getattr(model, "append_only_noun", "") or f"{model.__name__} rows"
    return error(f"{noun} are never {verb}{getattr(model, 'append_only_hint', '')}")


class AppendOnlyQuerySet(models.QuerySet):
    """Refuses every bulk change: update, delete, bulk_update and update_or_create alike."""

    def update(self, **kwargs) -> NoReturn:
        raise refusal(self.model, "updated")

    def delete(self) -> NoReturn:
        raise refusal(self.model, "deleted")

    def bulk_update(self, objs, fields, batch_size=None) -> NoReturn:
        raise refusal(self.model, "updated")

    def update_or_create(self, defaults=None, create_defaults=None, **kwargs) -> NoReturn:
        raise refusal(self.model, "updated")


class AppendOnlyModel(models.Model):
    """Insert once, never update or delete. Subclasses may name their own error, noun and hint."""

    append_only_error: ClassVar[type[AppendOnlyError]] = AppendOnlyError
    append_only_noun: ClassVar[str] = ""  # "ledger rows"; empty: "<Model> rows"
    append_only_hint: ClassVar[str] = ""  # what to do instead, e.g. "; append an adjustment instead"

    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args, **kwargs) -> None:
        if not self._state.adding:
            raise refusal(type(self), "updated")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs) -> NoReturn:
        raise refusal(type(self), "deleted")


# --- The database's half: triggers ----------------------------------------------------------------


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


# Row triggers never fire on TRUNCATE: PostgreSQL gets a statement trigger of its own (SQLite has no TRUNCATE; its
# "DELETE FROM t" fires the row triggers). A transaction that sets this first may truncate: the test suite's flush
# between transactional tests, and nothing else (tests/conftest.py).
ALLOW_TRUNCATE = "SET LOCAL e31.allow_truncate = 'on'"


def _truncate_statements(vendor: str, *, table: str, what: str, forward: bool) -> list[str]:
    name = f"{table}_no_truncate"
    if vendor != "postgresql":
        return []
    if not forward:
        return [f"DROP TRIGGER IF EXISTS {name} ON {table}", f"DROP FUNCTION IF EXISTS {name}()"]
    return [
        f"""CREATE OR REPLACE FUNCTION {name}() RETURNS trigger AS $$
        BEGIN
            IF current_setting('e31.allow_truncate', true) IS DISTINCT FROM 'on' THEN
                RAISE EXCEPTION '{what} is append-only: TRUNCATE refused on %', TG_TABLE_NAME
                    USING ERRCODE = 'restrict_violation';
            END IF;
            RETURN NULL;
        END; $$ LANGUAGE plpgsql""",
        f"CREATE TRIGGER {name} BEFORE TRUNCATE ON {table} FOR EACH STATEMENT EXECUTE FUNCTION {name}()",
    ]


def refuse_truncate(table: str, *, what: str) -> migrations.RunPython:
    """A migration operation installing the TRUNCATE trigger on PostgreSQL (and removing it when reversed)."""

    def run(forward: bool):
        def apply(apps, schema_editor) -> None:
            for sql in _truncate_statements(
                schema_editor.connection.vendor, table=table, what=what, forward=forward
            ):
                schema_editor.execute(sql, params=None)  # no interpolation: the SQL holds a literal %

        return apply

    return migrations.RunPython(run(True), run(False))


def refusal_sql(
    vendor: str, *, table: str, what: str, events: tuple[str, ...] = ("UPDATE", "DELETE")
) -> list[str]:
    """The statements installing the trigger: for a migration that must make it again (SQLite drops a table's
    triggers when it rebuilds the table to alter it)."""
    return _statements(vendor, table=table, what=what, events=events, forward=True)


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
