from axes.models import AccessAttempt

from accounts.management import audited


class Command(audited.ResetCommand):
    help = "Reset all access attempts and lockouts for given usernames (each one lifted is audited)"

    def add_arguments(self, parser):
        parser.add_argument("username", nargs="+", type=str)

    def attempts(self, options):
        return AccessAttempt.objects.filter(username__in=options["username"])
