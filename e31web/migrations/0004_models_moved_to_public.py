"""The public pages' models left ``e31web`` for ``public`` (public 0001): state only, no table changes."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("e31web", "0003_seed_problems"),
        ("public", "0001_initial"),
    ]

    operations = [
        # State only: the tables, their rows, indexes, constraints and triggers stay as they are.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(
                    model_name="application",
                    name="problems",
                ),
                migrations.RemoveField(
                    model_name="application",
                    name="team",
                ),
                migrations.RemoveField(
                    model_name="invitation",
                    name="application",
                ),
                migrations.DeleteModel(
                    name="IntakeChange",
                ),
                migrations.RemoveField(
                    model_name="invitation",
                    name="team",
                ),
                migrations.RemoveField(
                    model_name="invitation",
                    name="user",
                ),
                migrations.DeleteModel(
                    name="Measurement",
                ),
                migrations.RemoveField(
                    model_name="problemrevision",
                    name="problem",
                ),
                migrations.DeleteModel(
                    name="WaitlistEntry",
                ),
                migrations.DeleteModel(
                    name="Application",
                ),
                migrations.DeleteModel(
                    name="Invitation",
                ),
                migrations.DeleteModel(
                    name="Problem",
                ),
                migrations.DeleteModel(
                    name="ProblemRevision",
                ),
            ],
            database_operations=[],
        ),
    ]
