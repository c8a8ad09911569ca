"""Sign-in pages and the API tokens page."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_POST

from accounts import scoping, services, team_secrets
from accounts.models import ApiToken, TeamSecret


@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    new_token = None
    if request.method == "POST":
        label = request.POST.get("label", "").strip()[:80] or "token"
        _, new_token = services.create_api_token(user=request.user, label=label)
    rows = ApiToken.objects.filter(user=request.user)
    return render(request, "accounts/tokens.html", {"tokens": rows, "new_token": new_token})


@login_required
@require_POST
def revoke_token(request: HttpRequest, token_id: int) -> HttpResponse:
    if services.revoke_api_token(token_id=token_id, user=request.user, now=timezone.now()):
        messages.success(request, "Token revoked: it no longer works.")
    return redirect("accounts:tokens")


@sensitive_post_parameters("value")  # never in an error report
@login_required
def secrets_page(request: HttpRequest) -> HttpResponse:
    """Names of the user's teams' secrets; a team admin sets or deletes them. Values are never rendered."""
    teams = list(scoping.teams_of(request.user))
    error, status = "", 200
    if request.method == "POST":
        team = next((t for t in teams if t.slug == request.POST.get("team")), None)
        if team is None or not scoping.is_team_admin(request.user, team):
            error, status = "only a team admin sets the team's secrets", 403
        else:
            name = request.POST.get("name", "").strip()
            try:
                team_secrets.set_secret(
                    team=team,
                    name=name,
                    value=request.POST.get("value", ""),
                    user=request.user,
                    now=timezone.now(),
                )
            except team_secrets.SecretInvalid as exc:
                error, status = str(exc), 422
            else:
                messages.success(
                    request, f"{team.name}: secret {name} saved. Its value will not be shown again."
                )
                return redirect("accounts:secrets")
    rows = (
        TeamSecret.objects.filter(team__in=teams)
        .select_related("team", "set_by")
        .order_by("team__name", "name")
    )
    admin_of = [t for t in teams if scoping.is_team_admin(request.user, t)]
    # A refused secret comes back with its team still chosen, as its name is kept: else Save, pressed again,
    # would set it on the first team.
    context = {
        "rows": rows,
        "teams": admin_of,
        "error": error,
        "name_input": request.POST.get("name", ""),
        "team_input": request.POST.get("team", ""),
    }
    return render(request, "accounts/secrets.html", context, status=status)


@login_required
@require_POST
def delete_secret(request: HttpRequest, team_slug: str) -> HttpResponse:
    team = scoping.teams_of(request.user).filter(slug=team_slug).first()
    if team is None:
        raise Http404("No such object")
    name = request.POST.get("name", "")
    if not scoping.is_team_admin(request.user, team):
        messages.error(request, "Only a team admin deletes the team's secrets.")
    elif team_secrets.delete_secret(team=team, name=name):
        messages.success(request, f"{team.name}: secret {name} deleted.")
    return redirect("accounts:secrets")
