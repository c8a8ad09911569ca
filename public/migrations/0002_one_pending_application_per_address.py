"""One pending application per address (compared lowercased).

Applications sent again before this constraint existed are declined here, each naming the earlier one
it repeats, so the constraint can be created and operators still read every row.
"""

from django.db import migrations, models
from django.db.models.functions import Lower


def decline_repeats(apps, schema_editor) -> None:
    Application = apps.get_model("public", "Application")
    first_by_address: dict[str, int] = {}
    for application in Application.objects.filter(status="pending").order_by("created_at", "id"):
        address = application.email.lower()
        if address not in first_by_address:
            first_by_address[address] = application.id
            continue
        application.status = "declined"
        application.decided_at = application.created_at
        application.decided_by = "console"
        application.decision_note = f"Sent again: a repeat of application #{first_by_address[address]}."
        application.save(update_fields=["status", "decided_at", "decided_by", "decision_note"])


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0003_team_egress"),
        ("public", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(decline_repeats, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="application",
            constraint=models.UniqueConstraint(
                Lower("email"), condition=models.Q(status="pending"), name="one_pending_application_per_address"
            ),
        ),
    ]
