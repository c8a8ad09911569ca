"""Each team's log bytes counted from what its jobs' logs hold, in a migration of its own: the scan runs without
holding the allocation table that 0034 altered (scheduling and agents go on meanwhile)."""

from django.db import migrations
from django.db.models import Sum
from django.db.models.functions import Length


def count_the_logs_already_held(apps, schema_editor):
    """Every team starts from what its jobs' logs hold now, so the budget counts the logs kept before it. On
    PostgreSQL no chunk is written while they are counted; one an older agent writes after is never subtracted
    below nothing (``jobs.logs._prune_batch``)."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("LOCK TABLE jobs_logchunk IN SHARE MODE")
    chunks, held = apps.get_model("jobs", "LogChunk"), apps.get_model("jobs", "TeamLogBytes")
    totals = chunks.objects.values("job__team_id").annotate(n=Sum(Length("data"))).order_by()
    held.objects.bulk_create(held(team_id=row["job__team_id"], bytes=row["n"]) for row in totals)


class Migration(migrations.Migration):
    dependencies = [("jobs", "0034_team_log_bytes")]

    operations = [migrations.RunPython(count_the_logs_already_held, migrations.RunPython.noop)]
