from axes.models import AccessAttempt

from accounts.management import audited


class Command(audited.ResetCommand):
    help = "Reset all access attempts and lockouts (each one lifted is audited)"

    def attempts(self, options):
        return AccessAttempt.objects.all()
