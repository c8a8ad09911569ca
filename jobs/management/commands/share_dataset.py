"""Operators: share a dataset folder under a data root with named teams, stop sharing it, or list shares."""

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from jobs import sharing
from jobs.models import DataShare


class Command(BaseCommand):
    help = (
        "Lets named teams read a dataset folder besides their own <data root>/<team>/ prefix: "
        "python manage.py share_dataset /data/shared/imagenet --team vision --team audio "
        "(--revoke to stop, --list to show every share)"
    )

    def add_arguments(self, parser):
        parser.add_argument("path", nargs="?", help="a folder under one of E31_DATA_ROOTS")
        parser.add_argument("--team", action="append", default=[], help="a team's slug; repeat for several")
        parser.add_argument("--note", default="", help="why it is shared (shown in the list)")
        parser.add_argument(
            "--revoke", action="store_true", help="stop sharing with the named teams (all if none)"
        )
        parser.add_argument("--list", action="store_true", help="show every shared folder and its teams")

    def handle(
        self, *args, path: str | None, team: list[str], note: str, revoke: bool, list: bool, **options
    ):
        if list:
            for share in DataShare.objects.prefetch_related("teams"):
                teams = ", ".join(t.slug for t in share.teams.all())
                self.stdout.write(f"{share.path}\t{teams}\t{share.note}")
            return
        if not path:
            raise CommandError("name the folder to share (or --list)")
        try:
            if revoke:
                left = sharing.unshare_dataset(path=path, team_slugs=team)
                self.stdout.write(f"{path}: shared with {left} team(s) now")
                return
            share = sharing.share_dataset(
                path=path, team_slugs=team, by="manage.py", now=timezone.now(), note=note
            )
        except sharing.ShareRefused as exc:
            raise CommandError(str(exc)) from exc
        teams = ", ".join(t.slug for t in share.teams.all())
        self.stdout.write(self.style.SUCCESS(f"{share.path} is readable by: {teams}"))
