from axes.models import AccessAttempt

from accounts.management import audited


class Command(audited.ResetCommand):
    help = "Reset all access attempts and lockouts for a given IP address and username (each one lifted is audited)"

    def add_arguments(self, parser):
        parser.add_argument("ip", type=str)
        parser.add_argument("username", type=str)

    def attempts(self, options):
        return AccessAttempt.objects.filter(ip_address=options["ip"], username=options["username"])
