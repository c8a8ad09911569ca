from django.core.management.base import BaseCommand

from accounts import team_secrets
from notifications import services as notifications


class Command(BaseCommand):
    help = (
        "Re-encrypts every team secret and webhook signing secret under the first key of E31_SECRETS_KEYS "
        "(put the new key first, run this, then drop the old key)."
    )

    def handle(self, *args, **options):
        count = team_secrets.rotate()
        hooks = notifications.reseal_webhook_secrets()
        self.stdout.write(
            f"{count} team secret(s) and {hooks} webhook secret(s) re-encrypted under the first key"
        )
