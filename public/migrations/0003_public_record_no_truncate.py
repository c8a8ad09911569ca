"""TRUNCATE fires no row trigger: the public record refuses it with a statement trigger (common.append_only).
The tables kept the names they had in ``e31web``, where their row triggers were installed (e31web 0002)."""

from django.db import migrations

from common.append_only import refuse_truncate


class Migration(migrations.Migration):
    dependencies = [
        ("public", "0002_one_pending_application_per_address"),
        ("e31web", "0002_append_only_triggers"),
    ]

    operations = [
        refuse_truncate("e31web_problemrevision", what="the public record"),
        refuse_truncate("e31web_measurement", what="the public record"),
        refuse_truncate("e31web_intakechange", what="the public record"),
    ]
