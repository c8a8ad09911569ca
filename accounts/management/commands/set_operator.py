from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from accounts import backends, services
from accounts.management import audited


class Command(BaseCommand):
    help = (
        "Makes the account USERNAME an operator (--superuser: one who may change anything in the admin too), or "
        "takes both back (--revoke); each change is audited. The account must exist."
    )

    def add_arguments(self, parser):
        parser.add_argument("username", help="its username in any case, or its e-mail address")
        what = parser.add_mutually_exclusive_group()
        what.add_argument("--superuser", action="store_true", help="make it a superuser as well")
        what.add_argument("--revoke", action="store_true", help="take its operator and superuser rights back")

    def handle(self, *args, username: str, superuser: bool, revoke: bool, **options):
        name = backends.stored_username(username.strip())
        user = get_user_model()._default_manager.filter(username=name).first()
        if user is None:
            raise CommandError(f"no account is named {username!r}")
        actor = audited.shell_actor("set_operator")
        superuser_now = True if superuser else None  # kept as it is, unless asked for
        changed = services.set_operator(
            user_id=user.id, operator=not revoke, superuser=superuser_now, actor=actor, now=timezone.now()
        )
        rights = "neither operator nor superuser" if revoke else "a superuser" if superuser else "an operator"
        state = "is now" if changed else "was already"
        self.stdout.write(f"{user.get_username()} {state} {rights}.")
