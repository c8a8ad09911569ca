"""The secrets keys' rotation, for the team secrets (accounts) and the webhooks' signing secrets (notifications)
alike: an operator's command here, as neither app may import the other."""

from django.core.management.base import BaseCommand
from django.db import transaction

from accounts import team_secrets
from notifications import services as notifications


class Command(BaseCommand):
    help = (
        "Re-encrypts every team secret and webhook signing secret under the first key of E31_SECRETS_KEYS "
        "(put the new key first, run this, then drop the old key)."
    )

    def handle(self, *args, **options):
        with transaction.atomic():  # both or neither: a failure leaves every row under the keys it had
            count = team_secrets.rotate()
            hooks, unopened = notifications.reseal_webhook_secrets()
        self.stdout.write(
            f"{count} team secret(s) and {hooks} webhook secret(s) re-encrypted under the first key"
        )
        if unopened:
            self.stderr.write(
                f"no key of E31_SECRETS_KEYS opens the signing secret of webhook(s) {', '.join(map(str, unopened))}: "
                "left as they were; their events are not sent. Have their teams remove and add them again."
            )
