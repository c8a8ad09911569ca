"""Summary tables of the ledger, kept by a trigger on every ledger insert (metering.summaries),
filled from the rows already there."""

import django.db.models.deletion
from django.db import migrations, models

from metering import summaries


def install(apps, schema_editor) -> None:
    vendor = schema_editor.connection.vendor
    for sql in [*summaries.rebuild_sql(vendor), *summaries.install_sql(vendor)]:
        schema_editor.execute(sql, params=None)


def remove(apps, schema_editor) -> None:
    for sql in summaries.remove_sql(schema_editor.connection.vendor):
        schema_editor.execute(sql, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0001_initial"),
        ("jobs", "0004_staging_cache_and_delivery"),
        ("metering", "0002_ledger_append_only"),
    ]

    operations = [
        migrations.CreateModel(
            name="LedgerDay",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("day", models.DateField()),
                ("gpu_micros", models.BigIntegerField()),
                ("rows", models.BigIntegerField()),
                (
                    "team",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="accounts.team",
                    ),
                ),
            ],
            options={
                "indexes": [models.Index(fields=["day"], name="ledger_day_by_day")],
                "constraints": [
                    models.UniqueConstraint(fields=("team", "day"), name="ledger_day_one_row_per_team_day")
                ],
            },
        ),
        migrations.CreateModel(
            name="LedgerJobMonth",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("month", models.DateField()),
                ("metered", models.BigIntegerField()),
                ("adjusted", models.BigIntegerField()),
                (
                    "job",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="jobs.job",
                    ),
                ),
                (
                    "team",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="accounts.team",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["team", "month"], name="ledger_job_month_team"),
                    models.Index(fields=["month"], name="ledger_job_month_month"),
                ],
                "constraints": [
                    models.UniqueConstraint(fields=("job", "month"), name="ledger_job_month_one_row")
                ],
            },
        ),
        migrations.RunPython(install, remove),
    ]
