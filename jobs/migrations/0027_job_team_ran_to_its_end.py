from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0026_node_disk_bytes"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("team"),
                models.OrderBy(models.F("state_changed_at"), descending=True),
                models.OrderBy(models.F("id"), descending=True),
                condition=models.Q(
                    ("end_reason__in", ("succeeded", "failed", "timed_out", "out_of_memory")),
                    ("state", "released"),
                ),
                name="job_team_ran_to_its_end",
            ),
        ),
    ]
