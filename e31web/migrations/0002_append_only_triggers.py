"""The database refuses, for writes that bypass the models, what the models already refuse.

Revisions, measurements and intake changes are never updated or deleted; problems are never
deleted (see common.append_only). TRUNCATE (the test suite's flush on PostgreSQL) fires no row
triggers, so tests can still reset the tables.
"""

from django.db import migrations

from common.append_only import refuse_changes


class Migration(migrations.Migration):
    dependencies = [("e31web", "0001_initial")]

    operations = [
        refuse_changes("e31web_problemrevision", what="the public record"),
        refuse_changes("e31web_measurement", what="the public record"),
        refuse_changes("e31web_intakechange", what="the public record"),
        refuse_changes("e31web_problem", what="the public record", events=("DELETE",)),
    ]
