"""/api/v1/jobs: submit, list, read and cancel jobs."""

from django.db.models import Prefetch
from django.http import HttpRequest
from django.utils import timezone
from ninja import Query, Router, Schema
from ninja.errors import HttpError
from ninja.pagination import LimitOffsetPagination, paginate
from ninja.responses import Status

from accounts import scoping
from jobs import declaration, selectors, services
from jobs.models import Allocation, Job
from jobs.schemas import ErrorOut, JobIn, JobOut

router = Router(tags=["jobs"])
ERRORS = {400: ErrorOut, 401: ErrorOut, 404: ErrorOut, 409: ErrorOut, 422: ErrorOut}


class JobFilter(Schema):
    state: str | None = None


def job_queryset():
    return Job.objects.select_related("team").prefetch_related(
        "inputs", "events", Prefetch("allocations", queryset=Allocation.objects.select_related("node"))
    )


def job_json(job: Job) -> dict:
    return {
        "id": job.id, "name": job.name, "team": job.team.name, "state": job.state,
        "end_reason": job.end_reason, "exit_code": job.exit_code, "end_detail": job.end_detail,
        "submitted_at": job.submitted_at, "attempt": job.attempt,
        "work": {"argv": job.argv, "env": job.env, "image": job.image, "workdir": job.workdir},
        "data": [_input_json(d) for d in job.inputs.all()],
        "request": {
            "gpus": job.gpus, "hours": job.hours, "min_gpus": job.min_gpus, "gpu_model": job.gpu_model,
            "preemptible": job.preemptible, "requeue": job.requeue, "memory": job.memory_bytes, "cpus": job.cpus,
        },
        "output": {"uri": job.output_uri, "bytes": job.output_bytes},
        "events": [{"state": e.to_state, "at": e.at, "reason": e.reason} for e in job.events.all()],
        "allocations": [
            {
                "attempt": a.attempt, "node": a.node.name, "gpu_indices": a.gpu_indices,
                "rented_at": a.rented_at, "released_at": a.released_at, "end_reason": a.end_reason,
            }
            for a in job.allocations.all()
        ],
        "outputs": job.outputs or [],
        "delivery_state": job.delivery_state,
        "estimated_start": job.estimated_start,
        "pending_reason": job.pending_reason,
    }  # fmt: skip


class JsonPage:
    """A job queryset as the paginator sees it: counted in the database, and only the page it slices
    is fetched (with its prefetches) and turned into JSON, not every job the team has."""

    def __init__(self, jobs) -> None:
        self.jobs = jobs

    def __len__(self) -> int:
        return self.jobs.count()

    def __getitem__(self, page: slice) -> list[dict]:
        return [job_json(job) for job in self.jobs[page]]


def _input_json(d) -> dict:
    return {
        "name": d.name, "uri": d.uri, "bytes": d.bytes, "sha256": d.sha256, "stage_state": d.stage_state,
        "bytes_done": d.bytes_done, "rate_bytes_s": d.rate_bytes_s, "eta_s": selectors.eta_s(d),
    }  # fmt: skip


def _submitting_team(request: HttpRequest, slug: str):
    teams = list(scoping.teams_of(request.user))
    if not teams:
        raise HttpError(409, "You are not a member of any team; ask an operator to add you.")
    if slug:
        team = next((t for t in teams if t.slug == slug), None)
        if team is None:
            raise declaration.DeclarationInvalid([("team", f"{slug[:40]!r} is not one of your teams")])
        return team
    if len(teams) > 1:
        raise declaration.DeclarationInvalid([("team", "you belong to several teams: name one (its slug)")])
    return teams[0]


def _get_job(request: HttpRequest, job_id: int) -> Job:
    job = scoping.visible_to(request.user, job_queryset()).filter(id=job_id).first()
    if job is None:
        raise HttpError(404, "No such job")
    return job


@router.post("/jobs", response={201: JobOut, **ERRORS}, summary="Submit a job")
def submit_job(request: HttpRequest, payload: JobIn):
    team = _submitting_team(request, payload.team)
    spec = declaration.validate(payload.model_dump(), limits=services.pool_limits())
    job = services.submit_job(team=team, user=request.user, spec=spec, now=timezone.now())
    return Status(201, {**job_json(job_queryset().get(id=job.id)), "budget_note": job.budget_note})


@router.get("/jobs", response={200: list[JobOut], **ERRORS}, summary="List your team's jobs, newest first")
@paginate(LimitOffsetPagination)
def list_jobs(request: HttpRequest, filters: Query[JobFilter]):
    jobs = scoping.visible_to(request.user, job_queryset())
    if filters.state:
        jobs = jobs.filter(state=filters.state)
    return JsonPage(jobs)


@router.get("/jobs/{job_id}", response={200: JobOut, **ERRORS}, summary="One job with its events")
def get_job(request: HttpRequest, job_id: int):
    return job_json(_get_job(request, job_id))


@router.post("/jobs/{job_id}/cancel", response={200: JobOut, **ERRORS}, summary="Cancel a live job")
def cancel_job(request: HttpRequest, job_id: int):
    job = _get_job(request, job_id)
    if not services.cancel_job(job_id=job.id, user=request.user, now=timezone.now()):
        raise HttpError(409, f"Job {job.id} is {job.state}: nothing to cancel")
    return job_json(_get_job(request, job_id))
