from axes.models import AccessAttempt

from accounts.management import audited


class Command(audited.ResetCommand):
    help = "Reset all access attempts and lockouts for given IP addresses (each one lifted is audited)"

    def add_arguments(self, parser):
        parser.add_argument("ip", nargs="+", type=str)

    def attempts(self, options):
        return AccessAttempt.objects.filter(ip_address__in=options["ip"])
