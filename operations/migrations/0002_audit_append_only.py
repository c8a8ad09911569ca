"""The database refuses UPDATE and DELETE on audit entries (see common.append_only)."""

from django.db import migrations

from common.append_only import refuse_changes


class Migration(migrations.Migration):
    dependencies = [("operations", "0001_initial")]

    operations = [refuse_changes("operations_auditentry", what="the audit log")]
