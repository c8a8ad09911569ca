"""What the audited commands share: who ran them, as the audit log names them, and the body of axes'
``axes_reset*`` commands, which this app's commands of the same names replace (accounts comes before axes in
INSTALLED_APPS) so that each lockout they lift is audited (``accounts.services.clear_lockouts``)."""

import getpass

from axes.models import AccessAttempt
from django.core.management.base import BaseCommand
from django.db.models import QuerySet
from django.utils import timezone

from accounts import services


def shell_actor(command: str) -> str:
    """The system account that ran ``manage.py command``: a shell has no signed-in operator to name."""
    try:
        who = getpass.getuser()
    except (OSError, KeyError):  # a uid with no name (a container's), and no LOGNAME or USER set
        who = "unknown"
    return f"{who} (manage.py {command})"


class ResetCommand(BaseCommand):
    """Removes the access attempts ``attempts`` picks, lifting their lockouts, as axes' command of the same name."""

    def attempts(self, options: dict) -> QuerySet[AccessAttempt]:
        raise NotImplementedError

    def handle(self, *args, **options) -> None:
        name = self.__module__.rsplit(".", 1)[-1]
        actor = shell_actor(name)
        count = services.clear_lockouts(attempts=self.attempts(options), actor=actor, now=timezone.now())
        self.stdout.write(f"{count} attempts removed." if count else "No attempts found.")
