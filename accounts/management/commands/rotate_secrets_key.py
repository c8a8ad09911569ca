from django.core.management.base import BaseCommand

from accounts import team_secrets


class Command(BaseCommand):
    help = (
        "Re-encrypts every team secret under the first key of E31_SECRETS_KEYS "
        "(put the new key first, run this, then drop the old key)."
    )

    def handle(self, *args, **options):
        count = team_secrets.rotate()
        self.stdout.write(f"{count} team secret(s) re-encrypted under the first key")
