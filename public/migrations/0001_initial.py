"""The public pages' models, moved here from ``e31web`` with their rows.

Every table keeps its ``e31web_*`` name (``db_table``), so this migration only tells Django's state
that the models now live in ``public``; the database is not touched. Databases that never had the
``e31web`` tables get them from e31web's migrations 0001-0003, which run first.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

MODELS = (
    "problem", "problemrevision", "measurement", "intakechange", "waitlistentry", "application", "invitation",
)  # fmt: skip


def _relabel(apps, *, old: str, new: str) -> None:
    """Moves the models' content types (and so their permissions) to the app they now belong to."""
    ContentType = apps.get_model("contenttypes", "ContentType")
    taken = set(ContentType.objects.filter(app_label=new, model__in=MODELS).values_list("model", flat=True))
    ContentType.objects.filter(app_label=old, model__in=set(MODELS) - taken).update(app_label=new)


def content_types_follow(apps, schema_editor) -> None:
    _relabel(apps, old="e31web", new="public")


def content_types_return(apps, schema_editor) -> None:
    _relabel(apps, old="public", new="e31web")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("accounts", "0001_initial"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("e31web", "0003_seed_problems"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        # State only: the tables, their rows, indexes, constraints and triggers stay as they are.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="IntakeChange",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("is_open", models.BooleanField()),
                        ("at", models.DateTimeField()),
                        ("by", models.CharField(max_length=150)),
                    ],
                    options={
                        "db_table": "e31web_intakechange",
                        "ordering": ["-at", "-id"],
                    },
                ),
                migrations.CreateModel(
                    name="WaitlistEntry",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("email", models.EmailField(max_length=150, unique=True)),
                        ("note", models.CharField(blank=True, max_length=500)),
                        ("created_at", models.DateTimeField()),
                    ],
                    options={
                        "verbose_name_plural": "waitlist entries",
                        "db_table": "e31web_waitlistentry",
                        "ordering": ["-created_at", "-id"],
                    },
                ),
                migrations.CreateModel(
                    name="Application",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("team_name", models.CharField(max_length=80)),
                        ("contact_name", models.CharField(max_length=120)),
                        ("email", models.EmailField(max_length=150)),
                        ("work", models.TextField(max_length=2000)),
                        ("data_bytes", models.BigIntegerField()),
                        ("data_location", models.CharField(max_length=500)),
                        ("compute_request", models.TextField(max_length=1000)),
                        ("output", models.TextField(max_length=1000)),
                        ("output_bytes", models.BigIntegerField()),
                        ("can_run_when", models.CharField(max_length=300)),
                        (
                            "status",
                            models.CharField(
                                choices=[
                                    ("pending", "Pending"),
                                    ("accepted", "Accepted"),
                                    ("declined", "Declined"),
                                ],
                                default="pending",
                                max_length=10,
                            ),
                        ),
                        ("created_at", models.DateTimeField()),
                        ("decided_at", models.DateTimeField(blank=True, null=True)),
                        ("decided_by", models.CharField(blank=True, max_length=150)),
                        ("decision_note", models.CharField(blank=True, max_length=1000)),
                        (
                            "team",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to="accounts.team",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "e31web_application",
                        "ordering": ["-created_at", "-id"],
                    },
                ),
                migrations.CreateModel(
                    name="Invitation",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("email", models.EmailField(max_length=150)),
                        ("digest", models.CharField(max_length=64, unique=True)),
                        ("created_at", models.DateTimeField()),
                        ("expires_at", models.DateTimeField()),
                        ("used_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "application",
                            models.OneToOneField(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="invitation",
                                to="public.application",
                            ),
                        ),
                        (
                            "team",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to="accounts.team",
                            ),
                        ),
                        (
                            "user",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "e31web_invitation",
                    },
                ),
                migrations.CreateModel(
                    name="Measurement",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("key", models.CharField(max_length=80)),
                        ("title", models.CharField(max_length=200)),
                        ("figures", models.JSONField()),
                        ("command", models.CharField(max_length=2000)),
                        ("measured_at", models.DateTimeField()),
                    ],
                    options={
                        "db_table": "e31web_measurement",
                        "ordering": ["-measured_at", "-id"],
                        "indexes": [
                            models.Index(fields=["key", "-measured_at"], name="e31web_meas_key_cc21a3_idx")
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="Problem",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("slug", models.SlugField(max_length=80, unique=True)),
                        ("title", models.CharField(max_length=120)),
                        ("summary", models.CharField(max_length=600)),
                        ("why_hard", models.TextField(max_length=4000)),
                        ("open_questions", models.JSONField(blank=True, default=list)),
                        ("measurement_keys", models.JSONField(blank=True, default=list)),
                        (
                            "status",
                            models.CharField(
                                choices=[("open", "Open"), ("solved", "Solved")], default="open", max_length=8
                            ),
                        ),
                        ("solution", models.TextField(blank=True, max_length=4000)),
                        ("solved_on", models.DateField(blank=True, null=True)),
                        ("position", models.PositiveIntegerField(default=0)),
                        ("added_at", models.DateTimeField()),
                        ("reviewed_at", models.DateTimeField()),
                    ],
                    options={
                        "db_table": "e31web_problem",
                        "ordering": ["position", "id"],
                        "constraints": [
                            models.CheckConstraint(
                                condition=models.Q(
                                    models.Q(
                                        ("solution", ""), ("solved_on__isnull", True), ("status", "open")
                                    ),
                                    models.Q(
                                        ("solved_on__isnull", False),
                                        ("status", "solved"),
                                        models.Q(("solution", ""), _negated=True),
                                    ),
                                    _connector="OR",
                                ),
                                name="problem_solved_only_with_solution_and_date",
                            )
                        ],
                    },
                ),
                migrations.AddField(
                    model_name="application",
                    name="problems",
                    field=models.ManyToManyField(
                        blank=True,
                        db_table="e31web_application_problems",
                        related_name="applications",
                        to="public.problem",
                    ),
                ),
                migrations.CreateModel(
                    name="ProblemRevision",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "kind",
                            models.CharField(
                                choices=[
                                    ("added", "added"),
                                    ("reworded", "reworded"),
                                    ("reviewed", "reviewed"),
                                    ("solved", "marked solved"),
                                ],
                                max_length=10,
                            ),
                        ),
                        ("at", models.DateTimeField(db_index=True)),
                        ("author", models.CharField(max_length=150)),
                        ("note", models.CharField(blank=True, max_length=300)),
                        ("title", models.CharField(max_length=120)),
                        ("summary", models.CharField(max_length=600)),
                        ("why_hard", models.TextField()),
                        ("open_questions", models.JSONField(default=list)),
                        ("measurement_keys", models.JSONField(default=list)),
                        ("status", models.CharField(max_length=8)),
                        ("solution", models.TextField(blank=True)),
                        ("solved_on", models.DateField(blank=True, null=True)),
                        (
                            "problem",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="revisions",
                                to="public.problem",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "e31web_problemrevision",
                        "ordering": ["at", "id"],
                    },
                ),
                migrations.AddIndex(
                    model_name="application",
                    index=models.Index(
                        fields=["status", "-created_at"], name="e31web_appl_status_9ba1ce_idx"
                    ),
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_types_follow, content_types_return),
    ]
