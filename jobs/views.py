"""Team-facing job pages: list, intake form, job page and its live fragments."""

import math
import re

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from accounts import scoping
from common import export as common_export
from common import paging, ratelimit
from common.operators import operator_only
from jobs import (
    declaration,
    estimates,
    logs,
    presenters,
    sandbox,
    selectors,
    services,
    signals,
    syscalls,
    units,
)
from jobs.forms import JobForm, JobListFilterForm, bound_fields, field_label
from jobs.lifecycle import ALIVE, BEFORE_RENT
from jobs.models import Job, JobArray

# Not str.isdigit: "²" is a digit to it and int("²") raises. Nine at most: int() refuses 4,300 digits, and
# an attempt, a rank or a row index past 999,999,999 is no such thing anyway.
DIGITS = re.compile(r"[0-9]{1,9}")
JOB_ID = re.compile(r"[0-9]{1,18}")  # what a bigint column holds

PAGE_SIZE = 25


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    """The team's jobs, filtered by state, name and submission time (all in the URL, so a view is a bookmark)."""
    form = JobListFilterForm(request.GET)
    filters = form.filters() if form.is_valid() else selectors.JobFilters(arrays_folded=True)
    jobs = selectors.job_list(request.user, filters).select_related("array").only(*presenters.LIST_FIELDS)
    page = paging.CappedPaginator(jobs, PAGE_SIZE).get_page(request.GET.get("page"))
    presenters.count_array_tasks(page, folded=filters.arrays_folded)
    context = {
        "page": page,
        "form": form,
        "array": _array_shown(request, filters),
        "folded": filters.arrays_folded,
        "filtered": filters not in (selectors.JobFilters(), selectors.JobFilters(arrays_folded=True)),
        "query": form.query_string(),
        "live": presenters.any_alive(page),
    }
    template = "jobs/list.html#job-rows" if request.htmx else "jobs/list.html"
    return render(request, template, context)


@login_required
@require_http_methods(["GET", "POST"])
def job_new(request: HttpRequest) -> HttpResponse:
    teams = list(scoping.teams_of(request.user))
    if not teams:
        return render(request, "jobs/no_team.html", status=403)
    if request.method == "GET":
        return _render_form(request, JobForm.blank(), teams)
    form = JobForm.from_post(request.POST)
    action = request.POST.get("action", "submit")
    if action == "add-input" or action.startswith("remove-input-"):
        _edit_rows(form, action)
        return _render_form(request, form, teams, rerun_of=_rerun_source(request, form))
    if action in ("load-file", "submit-file"):
        return _job_file(request, teams, submit=action == "submit-file")
    return _submit(request, form, teams)


def _edit_rows(form: JobForm, action: str) -> None:
    """Adds a blank data row, or removes the row whose Remove was pressed (its index as the form shows it)."""
    if action == "add-input":
        form.add_row()
        return
    index = action.removeprefix("remove-input-")
    if DIGITS.fullmatch(index) and int(index) < len(form.rows):
        form.rows.pop(int(index))


def _job_file(request: HttpRequest, teams, *, submit: bool) -> HttpResponse:
    """A TOML job file fills the form; with "submit" it is submitted as it is, if valid. On an error the
    file's text stays in the paste box, so the user fixes it there instead of pasting it again."""
    upload = request.FILES.get("job_file_upload")
    text = request.POST.get("job_file", "")
    try:
        if upload is not None:
            if upload.size > declaration.MAX_JOB_FILE_BYTES:
                raise declaration.DeclarationInvalid([("file", "a job file is at most 256 KB")])
            text = upload.read().decode("utf-8")
        raw = declaration.parse_job_file(text)
    except UnicodeDecodeError:
        form = JobForm(errors={"file": declaration.NOT_UTF8})
        return _render_form(request, form, teams, status=400)
    except declaration.DeclarationInvalid as exc:
        form = JobForm.blank()
        form.errors = exc.as_dict()
        return _render_form(request, form, teams, status=400, job_file=_kept_paste(text))
    form = JobForm.from_declaration(raw)
    if submit:
        return _submit(request, form, teams, raw=raw, job_file=text)
    if unknown := declaration.unknown_keys(raw):  # the form has no field for them: filled, they would be lost
        form.errors = declaration.DeclarationInvalid(unknown).as_dict()
        return _render_form(request, form, teams, status=400, job_file=_kept_paste(text))
    messages.info(request, "Job file loaded. Check the fields, then submit.")
    return _render_form(request, form, teams)


def _kept_paste(text: str) -> str:
    """What is put back in the paste box: nothing past the size a job file may have."""
    return text if len(text.encode("utf-8", "replace")) <= declaration.MAX_JOB_FILE_BYTES else ""


@login_required
def job_rerun(request: HttpRequest, job_id: int) -> HttpResponse:
    """The submit form filled from one of the team's jobs; what is submitted links to it."""
    source = scoping.get_visible_or_404(request.user, Job.objects.select_related("team"), id=job_id)
    teams = list(scoping.teams_of(request.user))
    if not teams:
        return render(request, "jobs/no_team.html", status=403)
    form = JobForm.from_declaration(declaration.as_mapping(selectors.declaration_of(source)))
    return _render_form(request, form, teams, rerun_of=source)


def _rerun_source(request: HttpRequest, form: JobForm) -> Job | None:
    """The job a posted form re-runs: only one the user may see (another's id is an error, never a link)."""
    wanted = request.POST.get("rerun_of", "")
    if not wanted:
        return None
    source = None
    if JOB_ID.fullmatch(wanted):
        source = scoping.visible_to(request.user, Job.objects.all()).filter(id=int(wanted)).first()
    if source is None:
        form.errors["rerun_of"] = "no job of your teams has this id"
    return source


def _submit(
    request: HttpRequest, form: JobForm, teams, *, raw: dict | None = None, job_file: str = ""
) -> HttpResponse:
    team = _chosen_team(request, teams)
    rerun_of = _rerun_source(request, form)
    raw = form.to_declaration() if raw is None else raw
    try:
        spec = declaration.validate(raw, limits=services.pool_limits(team=team))
    except declaration.DeclarationInvalid as exc:
        form.errors = {**exc.as_dict(), **form.errors}
    if form.errors or team is None:
        if team is None:
            form.errors["team"] = "choose one of your teams"
        return _render_form(request, form, teams, status=422, job_file=job_file, rerun_of=rerun_of)
    try:
        job = services.submit_job(
            team=team, user=request.user, spec=spec, now=timezone.now(), rerun_of=rerun_of
        )
    except declaration.DeclarationInvalid as exc:  # over an enforced budget, or a re-run into another team
        form.errors = exc.as_dict()
        return _render_form(request, form, teams, status=422, job_file=job_file, rerun_of=rerun_of)
    messages.success(request, f"Job #{job.id} submitted.")
    if job.budget_note:
        messages.warning(request, job.budget_note)
    response = redirect("jobs:detail", job_id=job.id)
    if request.htmx:
        response = HttpResponse(status=204, headers={"HX-Redirect": response["Location"]})
    return response


def _chosen_team(request: HttpRequest, teams):
    wanted = request.POST.get("team", "")
    if len(teams) == 1 and not wanted:
        return teams[0]
    return next((t for t in teams if str(t.id) == wanted), None)


def _render_form(
    request: HttpRequest,
    form: JobForm,
    teams,
    *,
    status: int = 200,
    job_file: str = "",
    rerun_of: Job | None = None,
) -> HttpResponse:
    context = {
        "form": form,
        "job_file": job_file,
        "f": bound_fields(form),
        "teams": teams,
        "chosen_team": request.POST.get("team", "") or (str(rerun_of.team_id) if rerun_of else ""),
        "folders": selectors.team_folders((_chosen_team(request, teams) or teams[0]).slug),
        "rerun_of": rerun_of,
        "refused_calls": syscalls.DENIED,
        "refused_families": list(syscalls.SOCKET_FAMILIES),
        "open_files": sandbox.JOB_OPEN_FILES,
        "scratch": units.format_size(settings.E31_SCRATCH_BYTES),
    }
    template = "jobs/new.html#job-form" if request.htmx else "jobs/new.html"
    return render(request, template, context, status=status)


def _job_page(request: HttpRequest, job_id: int) -> dict:
    jobs = selectors.with_canceller(Job.objects.select_related("team", "submitted_by"))
    job = scoping.get_visible_or_404(request.user, jobs, id=job_id)
    return presenters.job_page(job, now=timezone.now(), files_page=request.GET.get("files"))


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    return render(request, "jobs/detail.html", _job_page(request, job_id))


@login_required
def job_live(request: HttpRequest, job_id: int) -> HttpResponse:
    """The self-refreshing part of the job page (all that can change); it stops polling once the job
    has ended and its outputs are delivered."""
    return render(request, "jobs/detail.html#job-live", _job_page(request, job_id))


@login_required
def job_output(request: HttpRequest, job_id: int) -> HttpResponse:
    """One delivered output file of the current attempt, as a download from the job page."""
    job = scoping.get_visible_or_404(request.user, Job.objects.select_related("team"), id=job_id)
    path = request.GET.get("path", "")[:4096]
    try:
        handle = selectors.open_delivered_output(job, path)
    except selectors.OutputUnavailable as exc:
        if exc.status == 404:
            raise Http404(str(exc)) from exc
        return HttpResponse(str(exc), status=exc.status, content_type="text/plain; charset=utf-8")
    try:
        return common_export.file_download(
            handle,
            filename=path.rsplit("/", 1)[-1],
            holder=common_export.holder_for(request.user, job.team_id),
        )
    except common_export.Busy as busy:
        return busy.response()


@login_required
def job_log(request: HttpRequest, job_id: int) -> HttpResponse | StreamingHttpResponse:
    """The whole log of one attempt's part, as a download (up to E31_LOG_CAP_BYTES); 410 once it was removed."""
    job = scoping.get_visible_or_404(request.user, Job.objects.all(), id=job_id)
    attempt, rank = request.GET.get("attempt", ""), request.GET.get("rank", "0")
    if not (DIGITS.fullmatch(attempt) or attempt == "") or not DIGITS.fullmatch(rank):
        raise Http404("No such log")
    attempt_no = int(attempt or job.attempt)
    try:  # an empty download would read as a job that printed nothing
        logs.check_exists(job, attempt=attempt_no, rank=int(rank))
    except logs.NoSuchLog as exc:
        raise Http404(str(exc)) from exc
    if job.log_removed_at is not None:  # an empty file would read as a job that printed nothing
        return HttpResponse(logs.removed_note(job), status=410, content_type="text/plain; charset=utf-8")
    try:
        response = common_export.held_stream(
            logs.log_bytes(job, attempt=attempt_no, rank=int(rank)),
            content_type="text/plain; charset=utf-8",
            holder=common_export.holder_for(request.user, job.team_id),
        )
    except common_export.Busy as busy:
        return busy.response()
    name = f"job-{job.id}-attempt-{attempt_no}-rank-{int(rank)}.log"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


@login_required
@require_POST
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    job = scoping.get_visible_or_404(request.user, Job.objects.all(), id=job_id)
    if services.cancel_job(job_id=job.id, user=request.user, now=timezone.now()):
        messages.success(request, f"Job #{job.id}: cancel requested.")
    else:
        messages.warning(request, _why_not_cancelled(job))
    return redirect("jobs:detail", job_id=job.id)


def _why_not_cancelled(job: Job) -> str:
    """What stands in the way of a Cancel that changed nothing, read afresh: a cancel already requested
    (the job is still alive, its node agent stopping it) is not an ended job."""
    job.refresh_from_db(fields=["state", "cancel_requested_at"])
    if not job.is_alive:
        return f"Job #{job.id} has already ended."
    if not job.cancellable:
        return f"Job #{job.id} has finished running and is sealing its outputs: nothing is left to cancel."
    if job.cancel_requested_at:
        at = f"{job.cancel_requested_at:%Y-%m-%d %H:%M:%S} UTC"
        return f"Job #{job.id}: cancel already requested at {at}; its node agent is stopping it."
    return f"Job #{job.id} changed state as you pressed Cancel ({job.state}): press Cancel again."


def _array_shown(request: HttpRequest, filters: selectors.JobFilters) -> JobArray | None:
    """The array whose tasks the list is showing, with its tasks' states (None for another team's)."""
    if filters.array is None:
        return None
    array = scoping.visible_to(request.user, JobArray.objects.all()).filter(id=filters.array).first()
    if array is not None:
        array.task_states = selectors.array_outcomes([array.id]).get(array.id, {})
        # "Cancel every live task" is offered only while one lives.
        array.live_tasks = sum(n for state, n in array.task_states.items() if state in ALIVE)
    return array


@login_required
@require_POST
def array_cancel(request: HttpRequest, array_id: int) -> HttpResponse:
    array = scoping.get_visible_or_404(request.user, JobArray.objects.all(), id=array_id)
    cancelled = services.cancel_array(array_id=array.id, user=request.user, now=timezone.now())
    messages.success(
        request,
        f"Array {array.id}: cancel requested for {cancelled} live task{'s' if cancelled != 1 else ''}.",
    )
    return redirect(f"{reverse('jobs:list')}?array={array.id}")


@login_required
def queue(request: HttpRequest) -> HttpResponse:
    """Waiting jobs in priority order, each with its estimated start and the reason it is not running yet."""
    waiting = scoping.visible_to(
        request.user, Job.objects.filter(state__in=BEFORE_RENT).select_related("team")
    ).order_by(*selectors.QUEUE_ORDER)
    team = request.GET.get("team", "")
    size = request.GET.get("size", "")
    if team:
        waiting = waiting.filter(team__slug=team)
    waiting = selectors.of_size(waiting, size)
    page = paging.CappedPaginator(waiting, 50).get_page(request.GET.get("page"))
    context = {
        "page": page, "team": team, "size": size, "sizes": list(selectors.SIZE_CLASSES),
        "teams": scoping.teams_of(request.user).only("name", "slug"), "now": timezone.now(),
    }  # fmt: skip
    return render(request, "jobs/queue.html#queue-rows" if request.htmx else "jobs/queue.html", context)


def _estimable(gpus: object, hours: object) -> bool:
    """Whole GPUs and a time limit at all; inf or nan hours is asked for again, not estimated."""
    return (
        isinstance(gpus, int)
        and gpus >= 1
        and isinstance(hours, float)
        and math.isfinite(hours)
        and hours >= declaration.MIN_HOURS
    )


# How the preview names the fields it is asked for first; any other by the form's label.
PREVIEW_LABELS = {
    "request.gpus": "GPUs",
    "request.min_gpus": "Elastic minimum",
    "request.hours": "Time limit",
}
# Typing mistakes the form found in fields the estimate does not read (they are named when submitting).
NOT_ESTIMATED = ("name", "work", "output.uri")


def _problem(found: dict[str, str]) -> str:
    return "; ".join(
        f"{PREVIEW_LABELS.get(path) or field_label(path)}: {message}" for path, message in found.items()
    )


@login_required
@require_POST
def estimate(request: HttpRequest) -> HttpResponse:
    """The submit form's preview: when the job submitting would store would start, and what would make it sooner.
    What submitting would refuse is said instead, in its words. At most E31_PREVIEW_RATE per member."""
    if wait := ratelimit.wait_past_rate(f"preview:user:{request.user.pk}", settings.E31_PREVIEW_RATE):
        return _preview_paused(request, wait)
    form = JobForm.from_post(request.POST)
    draft = form.to_declaration()
    team = _chosen_team(request, list(scoping.teams_of(request.user)))
    context = {"options": [], "now": timezone.now(), "problem": ""}
    if team is None or not _estimable(draft["request"].get("gpus"), draft["request"].get("hours")):
        context["problem"] = "Enter GPUs and a time limit to see an estimated start."
        return render(request, "jobs/new.html#estimate", context)
    refused = {path: message for path, message in form.errors.items() if not path.startswith(NOT_ESTIMATED)}
    try:
        spec = estimates.draft_declaration(draft, team=team, limits=services.pool_limits(team=team))
    except declaration.DeclarationInvalid as invalid:
        refused = {**invalid.as_dict(), **refused}
    if refused:
        context["problem"] = f"No estimate yet. {_problem(refused)}."
        return render(request, "jobs/new.html#estimate", context)
    now = context["now"]
    tasks = len(spec.array.indices) if spec.array else 1  # an array weighs every task, as submitting it does
    context |= {
        "options": estimates.draft_options(
            draft=estimates.draft_job(spec, team=team, now=now), team=team, now=now
        ),
        "checkpointing": estimates.what_checkpointing_buys(declared=spec.checkpoint is not None),
        "tasks": tasks,
        "budget": signals.check_budget(team=team, gpu_hours=spec.gpus * spec.hours * tasks, now=now),
        "planned": selectors.planned_run(team_id=team.id, hours=spec.hours, started_at=None, now=now),
    }
    return render(request, "jobs/new.html#estimate", context)


def _preview_paused(request: HttpRequest, wait: int) -> HttpResponse:
    """429 with Retry-After; the form's own (htmx) request gets its fragment, which it swaps only on a 2xx."""
    count, _, period = settings.E31_PREVIEW_RATE.partition("/")
    per = {"s": "second", "m": "minute", "h": "hour", "d": "day"}[period[:1]]
    context = {"problem": f"More than {count} previews a {per}: the next one in {wait} s.", "options": []}
    response = render(request, "jobs/new.html#estimate", context, status=200 if request.htmx else 429)
    response["Retry-After"] = str(wait)
    return response


@operator_only
def transfers(request: HttpRequest) -> HttpResponse:
    """Operators: every staging input and every delivery in flight, with progress, and the cache's policy."""
    context = {
        "inputs": [*selectors.images_in_flight(), *selectors.staging_in_flight()],
        "deliveries": selectors.deliveries_in_flight(),
        "cache": selectors.cache_summary(),
    }
    template = "jobs/transfers.html#transfers-live" if request.htmx else "jobs/transfers.html"
    return render(request, template, context)
