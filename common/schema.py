"""Whether this code and the database's schema agree: the gate every worker, beat and node agent passes.

A process running code whose migrations differ from those the database has applied reads and writes rows
shaped for another schema: a column it does not know is left unset, one it expects is gone mid-job. So a
process compares the two before it starts, and a node agent again while it runs.

The code's side is read from the migration files once per process (``code()``), when it starts: a checkout
updated under a running process must not make its old code look new. The database's side is one query
(``applied``). The comparison (``disagreement``) is pure.
"""

import hashlib
import time
from dataclasses import dataclass
from functools import lru_cache

from django.db import OperationalError
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder

Key = tuple[str, str]  # (app label, migration name)
SHOWN = 3  # migrations named in a reason; the rest are counted


@dataclass(frozen=True)
class Code:
    """This checkout's migrations, as read from its files."""

    apps: frozenset[str]  # the apps it has migrations for
    known: frozenset[Key]  # every migration file, squashed ones and those they replace included
    needed: dict[Key, frozenset[Key]]  # each migration the schema must have -> what it replaces (a squash)
    version: str  # a short hash of the latest migration of each app: what the pool page compares


@lru_cache(maxsize=1)
def code() -> Code:
    """This process's migrations, read once: later calls answer for the code the process runs."""
    # No connection: the files alone, every squash in place of what it replaces.
    loader = MigrationLoader(None)
    return Code(
        apps=frozenset(loader.migrated_apps),
        known=frozenset(loader.disk_migrations),
        needed={key: frozenset(loader.graph.nodes[key].replaces) for key in loader.graph.nodes},
        version=version_of(loader.graph.leaf_nodes()),
    )


def version_of(leaves) -> str:
    """Twelve hex digits naming a schema: equal for two checkouts whose every app ends at the same migration."""
    text = "\n".join(f"{app}.{name}" for app, name in sorted(leaves))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def applied(connection) -> frozenset[Key]:
    """The migrations the database has applied: one query on django_migrations."""
    return frozenset(MigrationRecorder.Migration.objects.using(connection.alias).values_list("app", "name"))


def check(connection) -> str:
    """'' when this process's code and the database agree, else the one-line reason (see ``disagreement``)."""
    if not MigrationRecorder(connection).has_table():  # a database migrate never ran on
        return disagreement(code(), frozenset())
    return disagreement(code(), applied(connection))


def disagreement(code: Code, applied: frozenset[Key]) -> str:
    """Why ``code`` must not run against a database that applied ``applied``; '' when it may.

    Rows of apps this code has no migrations for are not counted: an app removed from the code leaves its rows
    behind, and no code reads its tables.
    """
    unknown = sorted(key for key in applied if key[0] in code.apps and key not in code.known)
    if unknown:
        return (
            f"the database has migrations this code does not know: {_names(unknown)}; "
            "upgrade this machine's checkout"
        )
    lacking = sorted(
        key
        for key, replaces in code.needed.items()
        if key not in applied and not (replaces and replaces <= applied)
    )
    if lacking:
        return f"this code has migrations the database lacks: {_names(lacking)}; run `python manage.py migrate` first"
    return ""


def _names(keys: list[Key]) -> str:
    shown = ", ".join(f"{app}.{name}" for app, name in keys[:SHOWN])
    return shown + (f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else "")


# After a reboot a web process or a worker may start before PostgreSQL takes connections: its check waits this
# long for the database, asking again at this pace, before it gives up.
DATABASE_WAIT_S = 60.0
DATABASE_RETRY_S = 2.0


def refuse_to_start(what: str, connection) -> None:
    """Exits with one line naming ``what`` (web, worker, beat) and why, when this code and the database disagree,
    or when the database has not answered for DATABASE_WAIT_S. An exit, not an exception: Celery logs a signal
    receiver's exception and goes on starting."""
    if reason := _check_when_up(connection):
        raise SystemExit(f"{what} not started: {reason}")


def _check_when_up(connection) -> str:
    give_up = time.monotonic() + DATABASE_WAIT_S
    while True:
        try:
            return check(connection)
        except OperationalError as exc:
            if time.monotonic() >= give_up:
                return f"the database does not answer: {str(exc).strip()}"
            time.sleep(DATABASE_RETRY_S)
