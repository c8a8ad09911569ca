"""Dataset folders an operator shares with named teams: the one exception to a team reading its own prefix."""

from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import transaction

from accounts.models import Team
from jobs import declaration
from jobs.models import DataShare


class ShareRefused(ValueError):
    pass


@transaction.atomic
def share_dataset(*, path: str, team_slugs: list[str], by: str, now: datetime, note: str = "") -> DataShare:
    """Lets the named teams read the folder (added to any teams it is already shared with)."""
    real = declaration.resolve_under_roots(path, settings.E31_DATA_ROOTS)
    if real is None or real in settings.E31_DATA_ROOTS:
        raise ShareRefused(f"{path} is not a folder under a data root (E31_DATA_ROOTS)")
    teams = _teams(team_slugs)
    share, _ = DataShare.objects.get_or_create(
        path=str(real), defaults={"shared_by": by[:150], "created_at": now, "note": note[:200]}
    )
    share.teams.add(*teams)
    return share


@transaction.atomic
def unshare_dataset(*, path: str, team_slugs: list[str]) -> int:
    """Stops sharing the folder with the named teams (with every team when none is named); teams left."""
    share = DataShare.objects.filter(path=str(Path(path).resolve())).first()
    if share is None:
        raise ShareRefused(f"{path} is not shared")
    if team_slugs:
        share.teams.remove(*_teams(team_slugs))
    else:
        share.teams.clear()
    if not share.teams.exists():
        share.delete()
        return 0
    return share.teams.count()


def shared_with(team_slug: str) -> list[Path]:
    """The folders shared with one team, as the declaration rules check them."""
    return [Path(p) for p in DataShare.objects.filter(teams__slug=team_slug).values_list("path", flat=True)]


def s3_prefixes(team_slug: str) -> list[str]:
    """Where a team's s3:// inputs and destinations lie: its prefix of each S3 root configured now."""
    return declaration.s3_team_prefixes(settings.E31_S3_ROOTS, team_slug)


def readable_roots(team_slug: str) -> list[Path]:
    """Where a team's file:// inputs may be read from: its folder of each data root and what is shared with it."""
    return [*declaration.team_prefixes(settings.E31_DATA_ROOTS, team_slug), *shared_with(team_slug)]


def _teams(slugs: list[str]) -> list[Team]:
    teams = list(Team.objects.filter(slug__in=slugs))
    missing = sorted(set(slugs) - {t.slug for t in teams})
    if missing or not slugs:
        raise ShareRefused(f"no such team: {', '.join(missing)}" if missing else "name at least one team")
    return teams
