from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from accounts import services


class Command(BaseCommand):
    help = "Creates an API token for USERNAME and prints it once (only its hash is stored)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--label", default="cli")
        parser.add_argument(
            "--days", help="how long it lasts: 1 to E31_TOKEN_MAX_DAYS (default E31_TOKEN_DAYS)"
        )
        parser.add_argument(
            "--read-only", action="store_true", help="it may only read (GET): no submit, cancel or change"
        )

    def handle(self, *args, username: str, label: str, days: str | None, read_only: bool, **options):
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"no active user named {username!r}")
        try:
            _, token = services.create_api_token(user=user, label=label, days=days, read_only=read_only)
        except (services.TooManyTokens, services.BadTokenDays) as exc:
            raise CommandError(f"{username}: {exc}") from exc
        self.stdout.write(token)
