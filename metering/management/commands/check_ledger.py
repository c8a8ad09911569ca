"""python manage.py check_ledger: the ledger's invariants, checked for every allocation."""

from django.core.management.base import BaseCommand
from django.utils import timezone

from metering import services


class Command(BaseCommand):
    help = (
        "Checks that every allocation's ledger rows tile RENT..RELEASE exactly and that the summaries equal "
        "the rows; exit code 1 on any violation."
    )

    def handle(self, *args, **options) -> None:
        violations = services.find_violations(now=timezone.now())
        for line in violations:
            self.stdout.write(line)
        self.stdout.write(f"{len(violations)} violation{'' if len(violations) == 1 else 's'}")
        if violations:
            raise SystemExit(1)
