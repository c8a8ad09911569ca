"""TRUNCATE fires no row trigger: the ledger refuses it with a statement trigger (common.append_only)."""

from django.db import migrations

from common.append_only import refuse_truncate


class Migration(migrations.Migration):
    dependencies = [("metering", "0003_ledger_summaries")]

    operations = [refuse_truncate("metering_meterentry", what="the meter ledger")]
