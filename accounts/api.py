"""/api/v1/teams/{slug}/secrets: list a team's secret names, set or replace a value, delete one.

No endpoint answers with a value: a secret is written here and read only by the node agent that
starts an attempt of a job declaring it.
"""

from datetime import datetime

from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, Router, Schema
from ninja.errors import HttpError
from ninja.responses import Status

from accounts import scoping, team_secrets
from accounts.models import Team, TeamSecret

router = Router(tags=["team secrets"])


class SecretError(Schema):
    detail: str


class SecretIn(Schema):
    value: str = Field(..., description="The value; stored encrypted and never returned by any endpoint.")


class SecretOut(Schema):
    name: str
    updated_at: datetime
    set_by: str = ""


ERRORS = {401: SecretError, 403: SecretError, 404: SecretError, 422: SecretError}


def _team(request: HttpRequest, slug: str, *, write: bool) -> Team:
    team = scoping.teams_of(request.user).filter(slug=slug).first()
    if team is None:
        raise HttpError(404, "No such team")
    if write and not scoping.is_team_admin(request.user, team):
        raise HttpError(403, "Only a team admin sets or deletes the team's secrets")
    return team


def _out(row: TeamSecret) -> dict:
    return {
        "name": row.name,
        "updated_at": row.updated_at,
        "set_by": row.set_by.username if row.set_by else "",
    }


@router.get(
    "/teams/{slug}/secrets", response={200: list[SecretOut], **ERRORS}, summary="List a team's secret names"
)
def list_secrets(request: HttpRequest, slug: str):
    team = _team(request, slug, write=False)
    return [_out(row) for row in TeamSecret.objects.filter(team=team).select_related("set_by")]


@router.put(
    "/teams/{slug}/secrets/{name}",
    response={200: SecretOut, **ERRORS},
    summary="Set or replace a team secret",
)
def set_secret(request: HttpRequest, slug: str, name: str, payload: SecretIn):
    team = _team(request, slug, write=True)
    try:
        row = team_secrets.set_secret(
            team=team, name=name, value=payload.value, user=request.user, now=timezone.now()
        )
    except team_secrets.SecretInvalid as exc:
        raise HttpError(422, str(exc)) from exc
    return _out(row)


@router.delete("/teams/{slug}/secrets/{name}", response={204: None, **ERRORS}, summary="Delete a team secret")
def delete_secret(request: HttpRequest, slug: str, name: str):
    team = _team(request, slug, write=True)
    if not team_secrets.delete_secret(team=team, name=name, user=request.user, now=timezone.now()):
        raise HttpError(404, "No such secret")
    return Status(204, None)
