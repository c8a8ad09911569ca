"""/api/v1/jobs: submit, list, read and cancel jobs, and read their logs."""

import dataclasses
import difflib
from datetime import UTC, datetime
from typing import Literal

from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, Query, Router, Schema
from ninja.errors import HttpError, Throttled
from ninja.pagination import paginate
from ninja.responses import Status
from pydantic import field_validator

from accounts import scoping
from common import export as common_export
from common import paging
from jobs import declaration, idempotency, logs, presenters, selectors, services
from jobs.models import Dependency, Job, JobArray, OutputFile
from jobs.schemas import ArrayOut, ErrorOut, JobIn, JobOut, OutputFileOut

router = Router(tags=["jobs"])
OUTPUT_PAGE_MAX = 1000  # files per page of /jobs/{id}/outputs
# Jobs per page of /jobs: each carries its inputs, prerequisites and events, so a page of 1,000 such jobs held a
# web thread for seconds; the CLI asks for 100 at a time.
JOB_PAGE_MAX = 100
# 429: every operation passes the throttle first
ERRORS = {400: ErrorOut, 401: ErrorOut, 404: ErrorOut, 409: ErrorOut, 422: ErrorOut, 429: ErrorOut}


class JobFilter(Schema):
    state: Literal[selectors.STATE_CHOICES] = Field(  # type: ignore[valid-type]
        "", description="A state, or a group: alive, waiting (before GPUs are held) or finished."
    )
    ended: Literal[selectors.ENDED_CHOICES] = Field(  # type: ignore[valid-type]
        "", description="Only the jobs that ended this way (their end_reason): succeeded, failed, cancelled…"
    )
    # No NUL: PostgreSQL text cannot hold one, so such a filter is a 422, not a 500.
    name: str = Field(
        "",
        max_length=selectors.NAME_SEARCH_MAX,
        pattern=r"^[^\x00]*$",
        description="Part of the name, any case (on the embedded SQLite default: any case of ASCII letters only).",
    )
    team: str = Field("", max_length=80, pattern=r"^[^\x00]*$", description="Team slug.")
    since: datetime | None = Field(None, description="Submitted at or after (ISO 8601; UTC if no offset).")
    until: datetime | None = Field(None, description="Submitted before (ISO 8601; UTC if no offset).")
    array: int | None = Field(None, ge=1, le=2**31 - 1, description="Only the tasks of this array.")
    before: int | None = Field(
        None, ge=1, le=2**31 - 1,
        description="Only the jobs listed after this one (newest first): give the last id of the page before, "
        "with offset 0, to read a long list page by page while it changes, no job skipped or repeated.",
    )  # fmt: skip

    @field_validator("since", "until")
    @classmethod
    def in_utc(cls, value: datetime | None) -> datetime | None:
        """In UTC, so any offset the client sends is one the database accepts."""
        if value is None:
            return None
        try:
            return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        except OverflowError as exc:
            raise ValueError("out of range") from exc


class JobPages(paging.CappedLimitOffset):
    class Input(paging.CappedLimitOffset.Input):
        limit: int = Field(JOB_PAGE_MAX, ge=1, le=JOB_PAGE_MAX)

    def serialise(self, item: Job) -> dict:
        return job_json(item)


def job_queryset():
    return selectors.with_details(Job.objects.select_related("team", "array"))


def job_json(job: Job) -> dict:
    return {
        "id": job.id, "name": job.name, "team": job.team.name, "team_slug": job.team.slug, "state": job.state,
        "end_reason": job.end_reason, "exit_code": job.exit_code, "end_detail": job.end_detail,
        "submitted_at": job.submitted_at, "attempt": job.attempt,
        "work": {"argv": job.argv, "env": job.env, "image": job.image, "secrets": job.secrets, "workdir": job.workdir},
        "data": [_input_json(d) for d in job.detail_inputs],
        "image": _image_json(getattr(job, "image_pull", None)),
        "request": {
            "gpus": job.gpus, "hours": job.hours, "min_gpus": job.min_gpus, "max_gpus": job.max_gpus, "gpu_model": job.gpu_model,
            "preemptible": job.preemptible, "requeue": job.requeue, "memory": job.memory_bytes, "cpus": job.cpus,
            "checkpoint": {"signal": job.checkpoint_signal, "grace_s": job.checkpoint_grace_s, "bytes": job.checkpoint_bytes}
            if job.checkpoints else None,
        },
        "output": {"uri": job.output_uri, "bytes": job.output_bytes},
        "events": [{"state": e.to_state, "at": e.at, "reason": e.reason} for e in job.detail_events],
        "allocations": [
            {
                "attempt": a.attempt, "node": a.node.name, "gpu_indices": a.gpu_indices,
                "rented_at": a.rented_at, "released_at": a.released_at, "end_reason": a.end_reason,
                "network": a.network,
            }
            for a in job.detail_allocations
        ],
        "outputs": {
            "files": job.sealed_files, "bytes": job.sealed_bytes,
            "delivered_to": job.delivery_uri if job.sealed_files else "",
            "files_url": f"/api/v1/jobs/{job.id}/outputs", "files_listed": job.log_removed_at is None,
        },
        "delivery_state": job.delivery_state,
        "estimated_start": job.estimated_start,
        "pending_reason": job.pending_reason,
        "paused": presenters.paused(job),
        **_dependencies_json(job),
        "rerun_of": job.rerun_of_id,
        "array": _array_ref(job),
    }  # fmt: skip


def _array_ref(job: Job) -> dict | None:
    if job.array_id is None:
        return None
    a = job.array
    return {
        "id": a.id,
        "index": job.array_index,
        "size": a.size,
        "max_running": a.max_running,
        "spec": a.spec,
        "limit_of": a.limit_of_id,
    }


def _dependencies_json(job: Job) -> dict:
    before = job.detail_prerequisites
    return {
        "after_ok": [d.prerequisite_id for d in before if d.kind == Dependency.AFTER_OK],
        "after_any": [d.prerequisite_id for d in before if d.kind == Dependency.AFTER_ANY],
        "dependents": [d.job_id for d in job.detail_dependents],
        "dependents_total": job.dependents_total,
    }


def _image_json(pull) -> dict | None:
    if pull is None:
        return None
    return {
        "reference": pull.reference, "digest": pull.digest, "stage_state": pull.stage_state, "bytes": pull.bytes,
        "bytes_done": pull.bytes_done, "rate_bytes_s": pull.rate_bytes_s, "eta_s": selectors.eta_s(pull),
        "stage_detail": pull.stage_detail,
    }  # fmt: skip


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


def _visible(request: HttpRequest, job_id: int) -> Job:
    job = scoping.visible_to(request.user, Job.objects.all()).filter(id=job_id).first()
    if job is None:
        raise HttpError(404, "No such job")
    return job


def _get_job(request: HttpRequest, job_id: int) -> Job:
    job = scoping.visible_to(request.user, job_queryset()).filter(id=job_id).first()
    if job is None:
        raise HttpError(404, "No such job")
    return job


IDEMPOTENCY = (
    "Send an `Idempotency-Key` header (up to 255 printable characters) to make retries safe: the same key "
    "and body within 24 h answer 200 with the first job; the same key with another body is a 409."
)


@router.post(
    "/jobs", response={200: JobOut, 201: JobOut, **ERRORS}, summary="Submit a job", description=IDEMPOTENCY
)
def submit_job(request: HttpRequest, payload: JobIn):
    return _submit(request, payload.model_dump(), payload.team)


@router.post(
    "/jobs/file",
    response={200: JobOut, 201: JobOut, **ERRORS},
    summary="Submit a TOML job file",
    description="The body is the job file itself (`Content-Type: application/toml` or `text/plain`), read by the same rules as "
    "the form's job file; `team` in the file or the query names the team. " + IDEMPOTENCY,
    # Described as text/plain, which every OpenAPI client can send; application/toml is read the same way.
    openapi_extra={"requestBody": {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
def submit_job_file(request: HttpRequest, team: str = ""):
    try:
        raw = declaration.parse_job_file(request.body.decode("utf-8"))
    except UnicodeDecodeError as exc:  # an invalid job file (the CLI's exit 6), not a malformed request
        raise declaration.DeclarationInvalid([("file", declaration.NOT_UTF8)]) from exc
    return _submit(request, raw, team or str(raw.get("team", "")))


@router.post(
    "/jobs/{job_id}/rerun",
    response={200: JobOut, 201: JobOut, **ERRORS},
    summary="Submit a job again as it was declared",
    description="A new job with the source's declaration (checked again against today's rules), in its "
    "team, linked by `rerun_of`. " + IDEMPOTENCY,
)
def rerun_job(request: HttpRequest, job_id: int):
    source = _visible(request, job_id)
    raw = declaration.as_mapping(selectors.declaration_of(source))
    return _submit(request, raw, source.team.slug, rerun_of=source)


def _submit(request: HttpRequest, raw: dict, team_slug: str, *, rerun_of: Job | None = None):
    """Validates and submits; with an Idempotency-Key, a retry gets the first job back (200)."""
    key = request.headers.get("Idempotency-Key", "")
    if key and not idempotency.VALID_KEY.fullmatch(key):
        raise HttpError(422, "Idempotency-Key must be 1 to 255 printable ASCII characters without spaces.")
    # The key stands for this job in this team: the team a query chose (?team= beside a job file) is signed
    # with the body, and a re-run's key is for its source only.
    signed = {**raw, "team": team_slug, **({"rerun_of": rerun_of.id} if rerun_of else {})}
    digest, now = idempotency.body_sha256(signed), timezone.now()
    try:
        first = (
            idempotency.earlier_job(user=request.user, key=key, body_sha256=digest, now=now) if key else None
        )
        if first is None:
            team = _submitting_team(request, team_slug)
            spec = declaration.validate(raw, limits=services.pool_limits(team=team))
            job, first = _submit_once(request, team, spec, key, digest, now, rerun_of)
    except idempotency.KeyReused as exc:
        raise HttpError(409, str(exc)) from exc
    if first is not None:
        return Status(200, job_json(_get_job(request, first.id)))
    return Status(201, {**job_json(job_queryset().get(id=job.id)), "budget_note": job.budget_note})


def _submit_once(
    request: HttpRequest, team, spec, key: str, digest: str, now, rerun_of: Job | None
) -> tuple[Job, Job | None]:
    """(the new job, None), or (the first job, the first job) when a concurrent retry with the key won."""
    if not key:
        return services.submit_job(team=team, user=request.user, spec=spec, now=now, rerun_of=rerun_of), None
    job, created = idempotency.submit_once(
        team=team, user=request.user, spec=spec, key=key, body_sha256=digest, now=now, rerun_of=rerun_of
    )
    return job, None if created else job


@router.get("/jobs", response={200: list[JobOut], **ERRORS}, summary="List your team's jobs, newest first")
@paginate(JobPages)
def list_jobs(request: HttpRequest, filters: Query[JobFilter]):
    _known_parameters(request, {*JobFilter.model_fields, *JobPages.Input.model_fields})
    # A slug mistyped, or a team one is not in, is not a team with no jobs.
    if filters.team and not scoping.teams_of(request.user).filter(slug=filters.team).exists():
        raise HttpError(404, "No such team")
    try:
        listed = selectors.job_list(request.user, selectors.JobFilters(**filters.dict()))
    except selectors.UnknownCursor as exc:
        raise HttpError(422, str(exc)) from exc
    return selectors.with_details(listed.select_related("array"))


def _known_parameters(request: HttpRequest, known: set[str]) -> None:
    """A parameter the list does not take is a 422: ignored, a mistyped filter (stat=running) listed every job."""
    for name in request.GET:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            raise HttpError(
                422, f"Unknown parameter {name[:40]}" + (f" (did you mean {close[0]}?)." if close else ".")
            )


@router.get("/jobs/{job_id}", response={200: JobOut, **ERRORS}, summary="One job with its events")
def get_job(request: HttpRequest, job_id: int):
    return job_json(_get_job(request, job_id))


@router.get(
    "/jobs/{job_id}/outputs",
    response={200: list[OutputFileOut], **ERRORS},
    summary="The files the job's current attempt sealed, by path, a page at a time",
)
@paginate(paging.BoundedLimitOffset, max_limit=OUTPUT_PAGE_MAX)
def list_outputs(request: HttpRequest, job_id: int):
    job = _visible(request, job_id)
    return OutputFile.objects.filter(job_id=job.id, attempt=job.attempt).order_by("path")


class LogOut(Schema):
    attempt: int = Field(..., description="The attempt read (0 before the job first started).")
    rank: int
    ranks: int = Field(..., description="Nodes of this attempt; read each with rank=0..ranks-1.")
    latest_attempt: int
    offset: int
    next_offset: int = Field(..., description="Ask again from here to follow the log.")
    text: str
    complete: bool = Field(..., description="Nothing more will be written to this part's log.")
    retry_after_s: float = Field(0, description="Set when the console is busy with other followers.")
    removed: str = Field(
        "",
        description="Empty while the log is kept. Set once retention removed it (E31_LOG_KEEP_DAYS after the "
        "job ended): the sentence saying when, to show in its place; `text` is then empty and `complete` true.",
    )


@router.get(
    "/jobs/{job_id}/log",
    response={200: LogOut, **ERRORS},
    summary="A job's log from an offset, with long-polling",
    description="The whole log of an attempt's part (rank), up to E31_LOG_CAP_BYTES, a megabyte per answer. "
    "With `wait`, the answer waits up to that many seconds (at most 20) for new text: follow a log by "
    "asking again from `next_offset` until `complete`. A log is kept E31_LOG_KEEP_DAYS after the job ends; "
    "then `removed` says so.",
)
def job_log(
    request: HttpRequest,
    job_id: int,
    attempt: int = Query(0, ge=0, description="0: the latest attempt."),
    rank: int = Query(0, ge=0, le=1023),
    offset: int = Query(0, ge=0, le=paging.MAX_OFFSET),
    wait: float = Query(0, ge=0, le=20),
):
    job = _visible(request, job_id)
    try:
        piece, retry_after = logs.follow_log(job, attempt=attempt, rank=rank, offset=offset, wait_s=wait)
    except logs.NoSuchLog as exc:
        raise HttpError(404, str(exc)) from exc
    return {**dataclasses.asdict(piece), "retry_after_s": retry_after}


class _Busy(Throttled):
    """Every sending place of this web process is taken: a 429 with Retry-After, as the throttle's."""

    def __init__(self, busy: common_export.Busy) -> None:
        super().__init__(wait=busy.retry_after_s)
        self.message = str(busy)


@router.get(
    "/jobs/{job_id}/outputs/download",
    response={200: None, **ERRORS},
    summary="One sealed output file, read from the job's destination",
    description="`path` is a file's path as `/jobs/{id}/outputs` lists it (the current attempt's); answered once "
    "delivery has finished.",
    openapi_extra={"responses": {200: {"content": {"application/octet-stream": {}}}}},
)
def download_output(request: HttpRequest, job_id: int, path: str = Query(..., max_length=4096)):
    job = _visible(request, job_id)
    try:
        handle = selectors.open_delivered_output(job, path)
    except selectors.OutputUnavailable as exc:
        raise HttpError(exc.status, str(exc)) from exc
    try:
        return common_export.file_download(
            handle,
            filename=path.rsplit("/", 1)[-1],
            holder=common_export.holder_for(request.user, job.team_id),
        )
    except common_export.Busy as busy:
        raise _Busy(busy) from busy


@router.post("/jobs/{job_id}/cancel", response={200: JobOut, **ERRORS}, summary="Cancel a live job")
def cancel_job(request: HttpRequest, job_id: int):
    job = _get_job(request, job_id)
    if not services.cancel_job(job_id=job.id, user=request.user, now=timezone.now()):
        job.refresh_from_db(fields=["state", "cancel_requested_at"])
        # Its agent is stopping it: the same request again, answered alike.
        if job.is_alive and job.cancel_requested_at:
            return job_json(_get_job(request, job_id))
        if job.is_alive and not job.cancellable:
            raise HttpError(
                409, f"Job {job.id} has finished running and is sealing its outputs: nothing to cancel"
            )
        raise HttpError(409, f"Job {job.id} is {job.state}: nothing to cancel")
    return job_json(_get_job(request, job_id))


def _visible_array(request: HttpRequest, array_id: int) -> JobArray:
    array = (
        scoping.visible_to(request.user, JobArray.objects.select_related("team")).filter(id=array_id).first()
    )
    if array is None:
        raise HttpError(404, "No such array")
    return array


def _array_json(array: JobArray) -> dict:
    return {
        "id": array.id, "name": array.name, "team": array.team.name, "spec": array.spec, "size": array.size,
        "max_running": array.max_running, "submitted_at": array.submitted_at,
        "states": selectors.array_states([array.id]).get(array.id, {}), "tasks_url": f"/api/v1/jobs?array={array.id}",
    }  # fmt: skip


@router.get("/arrays/{array_id}", response={200: ArrayOut, **ERRORS}, summary="An array: its tasks' states")
def get_array(request: HttpRequest, array_id: int):
    return _array_json(_visible_array(request, array_id))


@router.post(
    "/arrays/{array_id}/cancel", response={200: ArrayOut, **ERRORS}, summary="Cancel every live task"
)
def cancel_array(request: HttpRequest, array_id: int):
    array = _visible_array(request, array_id)
    if not services.cancel_array(array_id=array.id, user=request.user, now=timezone.now()):
        # Tasks still stopping from a cancel asked before: the same request again, answered alike.
        if not selectors.array_stopping(array.id):
            raise HttpError(409, f"Array {array.id} has no live task: nothing to cancel")
    return _array_json(array)
