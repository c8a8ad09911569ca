"""Tests of a data migration put the database back at an older schema for a moment."""

from collections.abc import Iterator
from contextlib import contextmanager

from django.apps.registry import Apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor


@contextmanager
def migrated_back(
    targets: list[tuple[str, str | None]], *, state_of: tuple[str, str] | None = None
) -> Iterator[Apps]:
    """The database at ``targets`` for the block (its models as of ``state_of``, default the last target), then at
    the latest migrations again, whatever the block raised. A test that failed between the two once left the
    database at the old schema, and every later test that touched the tables changed since failed with it (a
    column "does not exist"), 28 of them in one run."""
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    try:
        yield executor.loader.project_state([state_of or targets[-1]]).apps
    finally:
        executor.loader.build_graph()  # the plan is recomputed from what is now applied
        executor.migrate(executor.loader.graph.leaf_nodes())
