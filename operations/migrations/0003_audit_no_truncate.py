"""TRUNCATE fires no row trigger: the audit log refuses it with a statement trigger (common.append_only)."""

from django.db import migrations

from common.append_only import refuse_truncate


class Migration(migrations.Migration):
    dependencies = [("operations", "0002_audit_append_only")]

    operations = [refuse_truncate("operations_auditentry", what="the audit log")]
