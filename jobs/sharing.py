"""Dataset folders an operator shares with named teams: the one exception to a team reading its own prefix."""

import os
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
    owner = _owner(real)
    if (
        owner is not None
        and owner not in teams
        and not DataShare.objects.filter(path=str(real), teams=owner).exists()
    ):
        raise ShareRefused(
            f"{path} lies in team {owner.slug}'s own folder: once shared, only the teams named read it, "
            f"so name {owner.slug} too (--team {owner.slug})"
        )
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
        owner = _owner(Path(share.path))
        if owner is not None and owner.slug in team_slugs and share.teams.exclude(id=owner.id).exists():
            raise ShareRefused(
                f"{path} lies in team {owner.slug}'s own folder: it keeps reading it while the folder is shared "
                "with other teams (revoke it from every team to end the share)"
            )
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
    """Where a team's file:// inputs may be read from: its folder of each data root and what is shared with it,
    less a folder of its own that is itself in a folder shared with other teams only (see ``withheld``)."""
    withheld_now = withheld(team_slug)
    own = [
        folder
        for folder in _own_folders(team_slug)
        if not any(folder == other or folder.is_relative_to(other) for other in withheld_now)
    ]
    return [*own, *shared_with(team_slug)]


def withheld(team_slug: str) -> list[Path]:
    """Shared folders that a team's own folders (``<root>/<slug>``) are, lie in or hold, not shared with it.

    A team's own folder never grants what a share covers: a share is what an operator said named teams may
    read, and a team's slug is only its name, which a team created later may happen to have (a team
    "ImageNet" and a shared ``<root>/imagenet``, or ``<root>/imagenet/train``). So such a folder is read only
    by the teams it is shared with: where the team's folder is the shared one (or lies in it), the team's
    folder is not among its roots; where its folder holds the shared one, only that part is withheld (staging
    refuses a file opened there, ``staging._check_not_withheld``). A share in an existing team's folder always
    names that team (``share_dataset``), so no team loses its own data by a share."""
    own = _own_folders(team_slug)
    folders = DataShare.objects.exclude(teams__slug=team_slug).values_list("path", flat=True)
    return [
        shared
        for shared in map(Path, folders)
        if any(
            shared == folder or shared.is_relative_to(folder) or folder.is_relative_to(shared)
            for folder in own
        )
    ]


def _own_folders(team_slug: str) -> list[Path]:
    return declaration.team_prefixes(settings.E31_DATA_ROOTS, team_slug)


def _owner(folder: Path) -> Team | None:
    """The existing team whose own folder of a data root ``folder`` is or lies in (``<root>/<slug>[/...]``)."""
    for root in map(os.path.realpath, settings.E31_DATA_ROOTS):
        if folder != Path(root) and folder.is_relative_to(root):
            return Team.objects.filter(slug=folder.relative_to(root).parts[0]).first()
    return None


def _teams(slugs: list[str]) -> list[Team]:
    teams = list(Team.objects.filter(slug__in=slugs))
    missing = sorted(set(slugs) - {t.slug for t in teams})
    if missing or not slugs:
        raise ShareRefused(f"no such team: {', '.join(missing)}" if missing else "name at least one team")
    return teams
