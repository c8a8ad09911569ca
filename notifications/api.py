"""/api/v1: a job's e-mail choice (``e31 submit --notify``) and a member's choices per team."""

from typing import Literal

from django.http import HttpRequest
from ninja import Router, Schema
from ninja.errors import HttpError

from accounts import scoping
from jobs.models import Job, JobArray
from jobs.schemas import ErrorOut
from notifications import selectors, services

router = Router(tags=["notifications"])
Choice = Literal["end", "failure", "never"]


class EmailIn(Schema):
    email: Choice


class JobEmailOut(Schema):
    job: int
    email: Choice


class ArrayEmailOut(Schema):
    array: int
    email: Choice
    tasks: int


class TeamEmailOut(Schema):
    team: str
    email: Choice


ERRORS = {400: ErrorOut, 401: ErrorOut, 404: ErrorOut, 409: ErrorOut, 422: ErrorOut}


@router.post(
    "/jobs/{job_id}/email",
    response={200: JobEmailOut, **ERRORS},
    summary="Choose this job's e-mail to its submitter (over the team preference)",
)
def set_job_email(request: HttpRequest, job_id: int, payload: EmailIn):
    job = scoping.visible_to(request.user, Job.objects.all()).filter(id=job_id).first()
    if job is None:
        raise HttpError(404, "No such job")
    try:
        services.set_job_email(job=job, user=request.user, email=payload.email)
    except services.NotAllowed as exc:
        raise HttpError(409, str(exc)) from exc
    return {"job": job.id, "email": payload.email}


@router.post(
    "/arrays/{array_id}/email",
    response={200: ArrayEmailOut, **ERRORS},
    summary="Choose the e-mail of every task of this array to its submitter (over the team preference)",
)
def set_array_email(request: HttpRequest, array_id: int, payload: EmailIn):
    array = scoping.visible_to(request.user, JobArray.objects.all()).filter(id=array_id).first()
    if array is None:
        raise HttpError(404, "No such array")
    try:
        tasks = services.set_array_email(array=array, user=request.user, email=payload.email)
    except services.NotAllowed as exc:
        raise HttpError(409, str(exc)) from exc
    return {"array": array.id, "email": payload.email, "tasks": tasks}


@router.get(
    "/notifications/email",
    response={200: list[TeamEmailOut], **ERRORS},
    summary="Your e-mail choice per team",
)
def email_choices(request: HttpRequest):
    return [{"team": team.slug, "email": email} for team, email in selectors.email_choices(request.user)]


@router.put(
    "/notifications/email/{team_slug}",
    response={200: TeamEmailOut, **ERRORS},
    summary="Choose e-mail for one team",
)
def set_email_choice(request: HttpRequest, team_slug: str, payload: EmailIn):
    team = scoping.teams_of(request.user).filter(slug=team_slug).first()
    if team is None:
        raise HttpError(404, "No such team")
    services.set_email_preference(user=request.user, team=team, email=payload.email)
    return {"team": team.slug, "email": payload.email}
