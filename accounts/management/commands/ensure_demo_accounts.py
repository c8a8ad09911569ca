from django.conf import settings
from django.core.management.base import BaseCommand

from accounts import services


class Command(BaseCommand):
    help = "Creates the demo operator and the member 'demo' of team 'demo' if missing, and prints each one's own password."

    def handle(self, *args, **options):
        created = services.ensure_demo_accounts(password=settings.E31_DEMO_PASSWORD)
        if not created:
            self.stdout.write("Demo accounts already exist (operator, demo); their passwords are unchanged.")
        for username, pw in created.items():
            self.stdout.write(f"  created {username!r} with password {pw}")
