from django.db import migrations, models

from accounts import team_secrets


def seal_the_secrets_kept_in_clear(apps, schema_editor):
    """Each webhook's signing secret, encrypted under the secrets key (accounts.team_secrets)."""
    webhooks = apps.get_model("notifications", "Webhook")
    for hook in webhooks.objects.only("id", "secret").order_by("id"):
        webhooks.objects.filter(id=hook.id).update(sealed_secret=team_secrets.seal(hook.secret))


def open_them_again(apps, schema_editor):
    webhooks = apps.get_model("notifications", "Webhook")
    for hook in webhooks.objects.only("id", "sealed_secret").order_by("id"):
        webhooks.objects.filter(id=hook.id).update(secret=team_secrets.unseal(hook.sealed_secret))


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0004_job_email_backoff"),
    ]

    operations = [
        migrations.AddField(
            model_name="webhook", name="sealed_secret", field=models.CharField(default="", max_length=400),
            preserve_default=False,
        ),
        migrations.RunPython(seal_the_secrets_kept_in_clear, open_them_again),
        # A default before it goes, so that undoing the removal can add the column back to rows that exist.
        migrations.AlterField(model_name="webhook", name="secret", field=models.CharField(default="", max_length=200)),
        migrations.RemoveField(model_name="webhook", name="secret"),
    ]
