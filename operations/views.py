"""The operator dashboard: pool, queue, utilisation, jobs and teams, health, audit log.

Operators only: visitors are sent to sign in, and for anyone else signed in these pages do not
exist (404, as for metering's operator pages and another team's objects). Every page renders a
fixed number of queries whatever the pool's size; its live part is a named fragment that polls
itself. Every action is a POST behind a confirmation step and goes through ``services``, which
writes the audit entry in the same transaction.
"""

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from accounts.models import Team
from common import paging
from common.operators import operator_only
from jobs import selectors as jobs_selectors
from jobs.lifecycle import State
from jobs.models import Job, Node
from operations import health, pages, pool, selectors, services, utilisation
from operations.models import AuditEntry
from public.models import Measurement

PAGE_SIZE = 50


def _page(
    request: HttpRequest, template: str, fragment: str, context: dict, *, status: int = 200
) -> HttpResponse:
    """The whole page, or only its live fragment when htmx polls for it."""
    name = f"operations/{template}.html"
    return render(request, f"{name}#{fragment}" if request.htmx else name, context, status=status)


def _confirmed(request: HttpRequest) -> bool:
    return request.POST.get("confirm") == "yes"


# --------------------------------------------------------------------------- pool


@operator_only
def pool_view(request: HttpRequest) -> HttpResponse:
    state = request.GET.get("state", "")
    state = state if state in Node.NodeState.values else ""
    context = {
        "pool": pool.pool_page(now=timezone.now(), state=state),
        "state": state,
        "states": Node.NodeState.values,
        "retired": pool.retired_nodes(),  # lazy: read only by the whole page, not by its polling fragment
    }
    return _page(request, "pool", "pool-grid", context)


@operator_only
@require_http_methods(["GET", "POST"])
def node_action(request: HttpRequest, name: str, action: str) -> HttpResponse:
    """GET: what the action will do, and a confirm box. POST with the box ticked: do it."""
    if action not in services.ACTIONS:
        raise Http404("No such action")
    # A retired node takes no action: its agent registering again is what brings it back.
    node = get_object_or_404(Node, name=name, retired_at__isnull=True)
    jobs = pages.jobs_on_node(node)
    if action not in selectors.actions_for(node.state, node.held_down_by, holding=bool(jobs)):
        messages.warning(request, f"{node.name} is {node.state}: “{action}” does not apply now.")
        return redirect("operations:pool")
    context = {"node": node, "action": action, "jobs": jobs}
    if request.method == "GET":
        return render(request, "operations/node_confirm.html", context)
    if not _confirmed(request):
        context["error"] = "Tick the box to confirm."
        return render(request, "operations/node_confirm.html", context, status=422)
    was_down = node.state == Node.NodeState.DOWN
    if services.change_node_state(name=name, action=action, actor=request.user, now=timezone.now()):
        node.refresh_from_db(fields=["state", "held_down_by"])
        messages.success(
            request, _what_happened(node, action, running=len(context["jobs"]), was_down=was_down)
        )
    else:
        messages.warning(request, f"{node.name} changed meanwhile: nothing was done.")
    return redirect("operations:pool")


def _what_happened(node: Node, action: str, *, running: int, was_down: bool = False) -> str:
    """The node's state after the action, as it is (a drain is under way until its jobs end)."""
    if action == "drain":
        until = (
            f"it becomes drained when its {running} running job{pluralize(running)} end{pluralize(running, 's,')}"
            if running
            else "nothing runs there: it becomes drained at the next scheduler pass"
        )
        return f"{node.name} is draining: no new job is placed on it; {until}."
    if action == services.RETIRE:
        return (
            f"{node.name} is retired: it leaves the pool's list and counts, and its /24 is free for another node; "
            "its agent registering again puts the machine back in service."
        )
    if action == "mark-down" and was_down:
        return f"{node.name} is held down: its agent registering again does not bring it back until an operator resumes it."
    if action == "mark-down":
        return (
            f"{node.name} is marked down: its allocations were released now, and it takes no work, "
            "whatever its agent says, until an operator resumes it."
        )
    if node.state == Node.NodeState.DOWN:
        return (
            f"{node.name} is no longer held down, but its agent is silent: it stays down, and no job is placed "
            "on it, until it comes back when its agent registers again."
        )
    return f"{node.name} is up: it takes new work from the next scheduler pass."


# --------------------------------------------------------------------------- queue and utilisation


@operator_only
def queue_view(request: HttpRequest) -> HttpResponse:
    filters = pages.QueueFilters.from_query(request.GET)
    page = paging.CappedPaginator(filters.apply(pages.waiting_jobs()), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    pages.attach_reservations(page)
    context = {
        "page": page, "filters": filters, "teams": Team.objects.only("name", "slug"), "now": timezone.now(),
        "sizes": list(jobs_selectors.SIZE_CLASSES), "states": pages.WAITING_STATES,
        "simulation": Measurement.objects.filter(key="scheduler.simulation").first(),
    }  # fmt: skip
    return _page(request, "queue", "queue-rows", context)


@operator_only
def utilisation_view(request: HttpRequest) -> HttpResponse:
    window = utilisation.WINDOWS.get(request.GET.get("range", ""), utilisation.WINDOWS["24h"])
    context = {"charts": pages.utilisation_charts(window=window, now=timezone.now()), "window": window}
    context["windows"] = utilisation.WINDOWS.values()
    return _page(request, "utilisation", "utilisation-charts", context)


# --------------------------------------------------------------------------- jobs


@operator_only
def jobs_view(request: HttpRequest) -> HttpResponse:
    filters = pages.JobFilters.from_query(request.GET)
    page = paging.CappedPaginator(filters.apply(pages.all_jobs()), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    pages.attach_nodes(page)
    context = {
        "page": page,
        "filters": filters,
        "teams": Team.objects.only("name", "slug"),
        **pages.JobFilters.choices(),
    }
    return _page(request, "jobs", "job-rows", context)


@operator_only
@require_http_methods(["GET", "POST"])
def job_action(request: HttpRequest, job_id: int, action: str) -> HttpResponse:
    """Cancel or requeue one job: GET shows what will happen; POST with the box ticked does it."""
    if action not in ("cancel", "requeue"):
        raise Http404("No such action")
    job = get_object_or_404(Job.objects.select_related("team"), id=job_id)
    context = {"job": job, "action": action, "allowed": pages.job_action_allowed(job, action)}
    if action == "requeue":
        context["submitter_gone"] = pages.submitter_gone(job)
    if request.method == "GET" or not context["allowed"]:
        return render(
            request, "operations/job_confirm.html", context, status=200 if context["allowed"] else 409
        )
    if not _confirmed(request):
        context["error"] = "Tick the box to confirm."
        return render(request, "operations/job_confirm.html", context, status=422)
    return _do_job_action(request, job, action)


def _do_job_action(request: HttpRequest, job: Job, action: str) -> HttpResponse:
    now = timezone.now()
    if action == "cancel":
        if services.cancel_job(job_id=job.id, actor=request.user, now=now):
            job.refresh_from_db(fields=["state"])
            said = (
                "it ended without running, unmetered"  # it held no GPUs: ENDED, never RELEASED
                if job.state == State.ENDED
                else "its process, if it started, stops and its GPUs are released"
            )
            messages.success(request, f"Job #{job.id}: cancelled ({said}).")
        else:
            messages.warning(request, f"Job #{job.id} had already ended or was already cancelling.")
        return redirect("operations:jobs")
    try:
        copy = services.requeue_job(job_id=job.id, actor=request.user, now=now)
    except services.RequeueRefused as exc:
        messages.warning(request, str(exc))
        return redirect("operations:jobs")
    messages.success(request, f"Job #{job.id} requeued as job #{copy.id}.")
    return redirect("jobs:detail", job_id=copy.id)


# --------------------------------------------------------------------------- teams


@operator_only
def teams_view(request: HttpRequest) -> HttpResponse:
    return render(request, "operations/teams.html", {"rows": pages.team_rows(now=timezone.now())})


@operator_only
@require_http_methods(["GET", "POST"])
def team_view(request: HttpRequest, slug: str) -> HttpResponse:
    team = get_object_or_404(Team, slug=slug)
    error, status = "", 200
    if request.method == "POST" and "egress" in request.POST:
        allowed = request.POST["egress"] == "allow"
        if services.set_team_egress(team_id=team.id, allowed=allowed, actor=request.user, now=timezone.now()):
            messages.success(
                request,
                f"{team.name}: jobs {'may reach the internet' if allowed else 'run offline'} from their next attempt.",
            )
        else:  # a stale page or a double submit: say so rather than claim an action
            messages.info(
                request,
                f"{team.name}: nothing changed (egress was already {'allowed' if allowed else 'denied'}).",
            )
        return redirect("operations:team", slug=team.slug)
    if request.method == "POST":
        share = pages.parse_number(request.POST.get("share", ""))
        try:
            changed = services.set_team_share(
                team_id=team.id, share=share, actor=request.user, now=timezone.now()
            )
        except ValueError as exc:
            error, status = str(exc), 422
        else:
            if changed:
                messages.success(request, f"{team.name}: share set to {share:g}.")
            else:
                messages.info(request, f"{team.name}: nothing changed (share was already {share:g}).")
            return redirect("operations:team", slug=team.slug)
    context = pages.team_page(team=team, now=timezone.now())
    context.update(error=error, share_input=request.POST.get("share", ""))
    return render(request, "operations/team.html", context, status=status)


# --------------------------------------------------------------------------- health and audit


@operator_only
def health_view(request: HttpRequest) -> HttpResponse:
    checks = health.run_all(now=timezone.now())
    context = {
        "checks": checks,
        "all_ok": all(c.ok for c in checks),
        "pending": sum(c.pending for c in checks),
        "now": timezone.now(),
    }
    return _page(request, "health", "health-checks", context)


@operator_only
@require_POST
def ledger_check(request: HttpRequest) -> HttpResponse:
    probe = services.check_ledger(now=timezone.now(), actor=request.user)
    if probe.ok:
        messages.success(request, "Ledger check passed.")
    else:
        messages.warning(request, "Ledger check found violations: see Ledger check below.")
    return redirect("operations:health")


@operator_only
def audit_view(request: HttpRequest) -> HttpResponse:
    filters = pages.AuditFilters.from_query(request.GET)
    page = paging.CappedPaginator(filters.apply(AuditEntry.objects.all()), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    return _page(request, "audit", "audit-rows", {"page": page, "filters": filters})
