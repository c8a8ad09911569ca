"""Makes the test database disagree with this code, as an upgrade half done would, and puts it back.

The rows are committed where the test commits (a subprocess must see them), so each helper restores what it
changed on the way out: a transactional test's flush leaves django_migrations alone.
"""

from collections.abc import Iterator
from contextlib import contextmanager

from django.db.migrations.recorder import MigrationRecorder
from django.utils import timezone

FUTURE = ("jobs", "0999_from_a_newer_checkout")
Migration = MigrationRecorder.Migration


@contextmanager
def database_newer() -> Iterator[str]:
    """A migration applied by newer code than this: the row a newer checkout's migrate would leave."""
    row = Migration.objects.create(app=FUTURE[0], name=FUTURE[1], applied=timezone.now())
    try:
        yield f"{row.app}.{row.name}"
    finally:
        Migration.objects.filter(id=row.id).delete()


@contextmanager
def code_newer(app: str = "jobs") -> Iterator[str]:
    """This code's latest migration of ``app`` not applied: the database of a checkout one migration behind."""
    row = Migration.objects.filter(app=app).order_by("-name").first()
    Migration.objects.filter(id=row.id).delete()
    try:
        yield f"{row.app}.{row.name}"
    finally:
        Migration.objects.create(app=row.app, name=row.name, applied=row.applied)
