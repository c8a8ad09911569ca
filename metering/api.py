"""/api/v1: a job's meter rows and a team's ledger. Another team's job or ledger is a 404."""

from datetime import date, datetime

from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, Query, Router, Schema
from ninja.errors import HttpError
from ninja.pagination import paginate

from accounts import scoping
from accounts.models import Team
from common import paging
from jobs.models import Job
from jobs.schemas import ErrorOut
from metering import reports, selectors
from metering.models import MeterEntry
from metering.periods import MICROS_PER_HOUR

router = Router(tags=["meter"])
ERRORS = {401: ErrorOut, 404: ErrorOut, 422: ErrorOut, 429: ErrorOut}  # 429: the throttle comes first


class EntryOut(Schema):
    period_start: datetime
    period_end: datetime
    gpus: int
    seconds: float = Field(..., description="Held seconds per GPU; `microseconds` is the exact figure.")
    microseconds: int = Field(..., description="Exact held time per GPU; negative on a credit.")
    kind: str = Field(..., description="accrual, final (the partial period at RELEASE) or adjustment")
    reason: str = Field("", description="Why, on an adjustment.")

    @staticmethod
    def resolve_seconds(obj: MeterEntry) -> float:
        return obj.microseconds / 1_000_000


class JobMeterOut(Schema):
    job_id: int
    entries: list[EntryOut]
    gpu_hours: float = Field(..., description="GPUs x held time over every row, adjustments included.")
    holding: bool = Field(..., description="GPUs are still held: the open period is not a row yet.")
    open_gpu_hours: float = Field(
        ...,
        description="GPUs x time held since the last closed row; a row once its UTC hour ends or at RELEASE.",
    )
    gpu_hours_so_far: float = Field(..., description="gpu_hours + open_gpu_hours: the running total.")


class LedgerEntryOut(EntryOut):
    id: int
    team: str = Field(..., alias="team.slug")
    job_id: int
    array_id: int | None = Field(
        None, alias="job.array_id", description="Set when the job is a task of an array."
    )
    allocation_id: int
    created_at: datetime


class LedgerQuery(Schema):
    start: date = Field(..., description="First day, YYYY-MM-DD (UTC).")
    end: date = Field(..., description="Last day, included, YYYY-MM-DD (UTC).")
    team: str = Field("", description="Team slug; needed only by members of several teams.")


@router.get("/jobs/{job_id}/meter", response={200: JobMeterOut, **ERRORS}, summary="A job's meter rows")
def job_meter(request: HttpRequest, job_id: int):
    job = scoping.visible_to(request.user, Job.objects.all()).filter(id=job_id).first()
    if job is None:
        raise HttpError(404, "No such job")
    entries = list(MeterEntry.objects.filter(job=job).order_by("period_start", "allocation_id", "id"))
    gpu_micros = sum(e.gpus * e.microseconds for e in entries)
    parts = selectors.job_meter(job, now=timezone.now())
    open_micros = sum(p.open_micros for p in parts)
    return {
        "job_id": job.id,
        "entries": entries,
        "gpu_hours": gpu_micros / MICROS_PER_HOUR,
        "holding": any(p.allocation.released_at is None for p in parts),
        "open_gpu_hours": open_micros / MICROS_PER_HOUR,
        "gpu_hours_so_far": (gpu_micros + open_micros) / MICROS_PER_HOUR,
    }


@router.get(
    "/ledger", response={200: list[LedgerEntryOut], **ERRORS}, summary="A team's ledger rows in a date range"
)
@paginate(paging.CappedLimitOffset)
def ledger(request: HttpRequest, filters: Query[LedgerQuery]):
    try:
        start, end = reports.parse_range(
            filters.start.isoformat(), filters.end.isoformat(), today=timezone.now().date()
        )
    except ValueError as exc:
        raise HttpError(422, f"Bad date range: {exc}.") from exc
    team = _team(request, filters.team)
    return (
        reports.in_range(team, start, end)
        .select_related("team", "job")
        .order_by("period_start", "allocation_id", "id")
    )


def _team(request: HttpRequest, slug: str) -> Team | None:
    """The named team if visible, the member's only team, or every team for an operator."""
    teams = scoping.teams_of(request.user)
    if slug:
        team = teams.filter(slug=slug).first()
        if team is None:
            raise HttpError(404, "No such team")
        return team
    if request.user.is_staff:
        return None
    mine = list(teams[:2])
    if not mine:
        raise HttpError(404, "You are not a member of any team.")
    if len(mine) > 1:
        raise HttpError(422, "You belong to several teams: name one with team=<slug>.")
    return mine[0]
