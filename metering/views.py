"""The ledger pages: a team's GPU-hours by month, day and job, the live hour, exports, and operators' tools."""

from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from decimal import InvalidOperation
from functools import wraps

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from accounts import scoping
from accounts.models import Team
from common import export as common_export
from common.operators import operator_only
from jobs.models import Allocation
from metering import reports, selectors, services
from metering.models import format_seconds
from metering.periods import micros, month_start, months_back, next_month, utc


class NoTeam(Exception):
    pass


def _scope(request: HttpRequest) -> Team | None:
    """The team asked for (404 unless visible), else the member's first team; ``None`` is every team, for operators."""
    slug = request.GET.get("team", "")
    if slug:
        team = scoping.teams_of(request.user).filter(slug=slug).first()
        if team is None:
            raise Http404("No such team")
        return team
    if request.user.is_staff:
        return None
    team = scoping.teams_of(request.user).first()
    if team is None:
        raise NoTeam
    return team


def _month(request: HttpRequest, now: datetime) -> datetime:
    """?month=YYYY-MM, or the current UTC month when absent, malformed or implausible."""
    try:
        year, month = (int(p) for p in request.GET.get("month", "").split("-"))
        if 2000 <= year <= 9000:  # keeps the month arithmetic (previous, twelve back) in range
            return datetime(year, month, 1, tzinfo=UTC)
    except ValueError:
        pass
    return month_start(utc(now))


def _team_pages(view: Callable) -> Callable:
    @wraps(view)
    def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except NoTeam:
            return render(request, "metering/no_team.html", status=403)

    return login_required(wrapped)


@_team_pages
def ledger(request: HttpRequest, *, export_refused: dict | None = None) -> HttpResponse:
    """The team's ledger (every team's, for operators); ``export_refused``: the export form's fields as typed,
    with why nothing was exported, shown beside them (400)."""
    now = timezone.now()
    team, month = _scope(request), _month(request, now)
    context = {**_live_context(team, now), **_month_context(team, month, now=now), **(export_refused or {})}
    context["teams"] = list(scoping.teams_of(request.user).only("id", "name", "slug"))
    if team is None:
        context["by_team"] = _team_totals(context["teams"], month)
    elif month == month_start(utc(now)):
        context["projection"] = selectors.projection(team=team, extra_gpu_hours=0.0, now=now)
    return render(request, "metering/ledger.html", context, status=400 if export_refused else 200)


def _month_context(team: Team | None, month: datetime, *, now: datetime) -> dict:
    days = reports.by_day(team=team, month=month)
    return {
        "month": month,
        "prev_month": months_back(month, 1),
        "next_month": next_month(month) if next_month(month) <= now else None,
        "months": reports.by_month(team=team, until=month),
        "days": days,
        "chart": reports.day_chart(days),
        "statement": reports.statement(team=team, month=month),
        "losses": list(reports.node_losses(team=team, month=month)),
        "team_query": f"team={team.slug}&" if team else "",
        "export_start": month.date(),
        "export_end": (next_month(month) - timedelta(days=1)).date(),
    }


def _team_totals(teams: list[Team], month: datetime) -> list[tuple[Team, int]]:
    totals = reports.by_team(month=month)
    return sorted(((t, totals.get(t.id, 0)) for t in teams), key=lambda pair: (-pair[1], pair[0].name))


@_team_pages
def ledger_live(request: HttpRequest) -> HttpResponse:
    """The self-refreshing current hour of the team's running jobs; when the ledger gained rows since the page
    was drawn (``seen``: a released job's last hour, an hour closed), the page redraws its statement too."""
    team = _scope(request)
    context = _live_context(team, timezone.now())
    response = render(request, "metering/ledger.html#ledger-live", context)
    if request.GET.get("seen", str(context["ledger_version"])) != str(context["ledger_version"]):
        response["HX-Trigger"] = "ledger-changed"
    return response


def _live_context(team: Team | None, now: datetime) -> dict:
    parts = reports.live(team=team, now=now)
    return {
        "team": team,
        "now": now,
        "ledger_version": selectors.ledger_version(team),
        "live_parts": parts,
        "live_this_hour": sum(p.this_hour_gpu_micros for p in parts),
        "live_unclosed": sum(p.unclosed_gpu_micros for p in parts),
        "rate": reports.rate(),
    }


# --- exports


def _export_scope(request: HttpRequest) -> tuple[Team | None, datetime, datetime] | HttpResponse:
    team = _scope(request)
    try:
        start, end = reports.parse_range(
            request.GET.get("start"), request.GET.get("end"), today=utc(timezone.now()).date()
        )
    except ValueError as exc:
        if "text/html" not in request.headers.get("Accept", ""):  # a script's client
            return HttpResponse(
                f"Bad date range: {exc}. Use start=YYYY-MM-DD&end=YYYY-MM-DD.\n",
                status=400,
                content_type="text/plain; charset=utf-8",
            )
        return ledger(request, export_refused=_export_refused(request, exc))
    return team, start, end


def _export_refused(request: HttpRequest, exc: ValueError) -> dict:
    """The export form as the browser sent it, and why nothing was exported, in the form's words."""
    typed = {}
    for field in ("start", "end"):
        try:
            typed[f"export_{field}"] = date.fromisoformat(request.GET.get(field, ""))
        except ValueError:
            typed[f"export_{field}"] = None
    why = str(exc).replace("the start date", "the From date").replace("the end date", "the To date")
    return {**typed, "export_error": f"Nothing was exported: {why}."}


def _filename(team: Team | None, start: datetime, end: datetime, ext: str) -> str:
    last = end - timedelta(days=1)
    return f"e31-ledger-{team.slug if team else 'all-teams'}-{start:%Y%m%d}-{last:%Y%m%d}.{ext}"


def _with_cost(rows: Iterator[dict]) -> Iterator[dict]:
    price = reports.rate()
    for row in rows:
        row["cost"] = str(reports.row_cost(row["gpu_us"], price))
        yield row


@_team_pages
def export(request: HttpRequest, fmt: str) -> HttpResponse:
    """The ledger rows of a team (or, for operators, every team) over a date range, as CSV or JSON."""
    scope = _export_scope(request)
    if isinstance(scope, HttpResponse):
        return scope
    team, start, end = scope
    rows = reports.export_rows(team=team, start=start, end=end)
    columns = list(reports.EXPORT_COLUMNS)
    if reports.rate() is not None:  # a display-time figure: computed here, never stored
        rows, columns = _with_cost(rows), [*columns, "cost"]
    filename = _filename(team, start, end, fmt)
    holder = common_export.holder_for(request.user, team.id if team else None)
    return common_export.streaming_export(rows, columns=columns, fmt=fmt, filename=filename, holder=holder)


# --- operators: budgets, adjustments, reconciliation


class BudgetForm(forms.Form):
    monthly_budget_gpu_hours = forms.DecimalField(
        label="Monthly budget (GPU-hours)", required=False, min_value=0, max_digits=12, decimal_places=2,
        help_text="Leave empty for no budget.",
    )  # fmt: skip
    budget_enforced = forms.BooleanField(
        label="Enforced: refuse jobs that would exceed it (otherwise warn only)", required=False
    )


@operator_only
@require_http_methods(["GET", "POST"])
def budget(request: HttpRequest, slug: str) -> HttpResponse:
    team = get_object_or_404(Team, slug=slug)
    initial = {
        "monthly_budget_gpu_hours": team.monthly_budget_gpu_hours,
        "budget_enforced": team.budget_enforced,
    }
    form = BudgetForm(request.POST if request.method == "POST" else None, initial=initial)
    if request.method == "POST" and form.is_valid():
        services.set_budget(
            team_id=team.id, gpu_hours=form.cleaned_data["monthly_budget_gpu_hours"],
            enforced=form.cleaned_data["budget_enforced"], operator=request.user, now=timezone.now(),
        )  # fmt: skip
        messages.success(request, f"Budget of team {team.name} saved.")
        return redirect(f"{reverse('metering:ledger')}?team={team.slug}")
    context = {
        "team": team,
        "form": form,
        "projection": selectors.projection(team=team, extra_gpu_hours=0.0, now=timezone.now()),
    }
    return render(request, "metering/budget.html", context, status=422 if form.is_bound else 200)


class AdjustForm(forms.Form):
    seconds = forms.DecimalField(
        label="Seconds per GPU (negative credits the team)", max_digits=16, decimal_places=6,
    )  # fmt: skip
    reason = forms.CharField(label="Reason", max_length=300)
    # The allocation's adjustments (GPU-microseconds) when the page was shown: a post made on an older view of
    # them (a double click, the back button, a second operator) is refused rather than booked twice.
    adjusted_seen = forms.IntegerField(widget=forms.HiddenInput)

    def clean_seconds(self) -> int:
        try:
            us = int(self.cleaned_data["seconds"] * 1_000_000)
        except (InvalidOperation, TypeError) as exc:
            raise forms.ValidationError("a number of seconds") from exc
        if us == 0:
            raise forms.ValidationError("an adjustment is not zero")
        return us


@operator_only
@require_http_methods(["GET", "POST"])
def adjust(request: HttpRequest, allocation_id: int) -> HttpResponse:
    allocation = get_object_or_404(Allocation.objects.select_related("job__team", "node"), id=allocation_id)
    adjustments = selectors.adjustments(allocation_id=allocation.id)
    adjusted = sum(row.gpus * row.microseconds for row in adjustments)
    initial = {"adjusted_seen": adjusted, **_gap_credit(allocation, adjusted)}
    form = AdjustForm(request.POST if request.method == "POST" else None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            services.adjust_meter(
                allocation_id=allocation.id, microseconds=form.cleaned_data["seconds"],
                reason=form.cleaned_data["reason"], author=request.user, now=timezone.now(),
                adjusted_seen=form.cleaned_data["adjusted_seen"],
            )  # fmt: skip
        except ValueError as exc:
            # Shown again with the adjustments as they are now: the operator looks, and may post it as it stands.
            form = AdjustForm({**request.POST.dict(), "adjusted_seen": adjusted}, initial=initial)
            form.is_valid()
            form.add_error("seconds", str(exc))
        else:
            messages.success(request, f"Adjustment recorded on job #{allocation.job_id}.")
            return redirect("jobs:detail", job_id=allocation.job_id)
    context = {
        "allocation": allocation, "form": form, "gap": selectors.silent_gap(allocation), "adjustments": adjustments,
    }  # fmt: skip
    return render(request, "metering/adjust.html", context, status=422 if form.is_bound else 200)


def _gap_credit(allocation: Allocation, adjusted: int) -> dict:
    """A node loss pre-fills a credit of the silent gap, from the last heartbeat (or RENT) to RELEASE, less what
    adjustments credited already (``adjusted``: their GPU-microseconds): a gap credited once is not offered again."""
    gap = selectors.silent_gap(allocation)
    if not gap or not allocation.gpu_count:
        return {}
    left = micros(gap) + min(adjusted, 0) // allocation.gpu_count
    if left <= 0:
        return {}
    return {
        "seconds": format_seconds(-left),
        "reason": "node lost: credit from the last heartbeat to the node declared down",
    }


@operator_only
def check(request: HttpRequest) -> HttpResponse:
    violations = services.find_violations(now=timezone.now())
    return render(request, "metering/check.html", {"violations": violations})
