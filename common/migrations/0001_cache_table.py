"""The database cache table the rate limits share when E31_CACHE_URL names no other cache.

``createcachetable`` creates the table of every database cache in CACHES and skips tables that
exist, so running it again (or with Redis configured, where it does nothing) is harmless. Run with
``migrate``, it is there before the first request on a fresh machine, ``make run`` included.
"""

from django.core.management import call_command
from django.db import migrations


def create_cache_table(apps, schema_editor) -> None:
    call_command("createcachetable", database=schema_editor.connection.alias, verbosity=0)


class Migration(migrations.Migration):
    dependencies = []

    operations = [migrations.RunPython(create_cache_table, migrations.RunPython.noop)]
