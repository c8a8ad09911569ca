"""Sign-in pages, the API tokens, team secrets and team members pages."""

from smtplib import SMTPException

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_POST

from accounts import emails, forms, members, scoping, selectors, services, team_secrets
from accounts.models import ApiToken, Team, TeamSecret
from common import links, ratelimit

# Tokens the token page makes per user a day, revoked or not: twice the live ones an account may hold. Each made and
# revoked in turn once renewed the API rate, and every one stays listed.
TOKENS_PER_DAY = 2 * services.ACTIVE_TOKENS

# A token made by the form's POST goes to the page the POST redirects to, which shows it once: shown in the answer
# to the POST itself, a reload of that page posted the form again and made a second token. It travels in a signed,
# short-lived cookie of that page, for its own user only: the server keeps nothing but the token's hash.
NEW_TOKEN_COOKIE, NEW_TOKEN_SALT, NEW_TOKEN_COOKIE_S = "e31_new_token", "accounts.new-token", 120


@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    new_token, refused, status = _new_token_shown(request), "", 200
    waits = request.method == "POST" and ratelimit.wait_past_rate(
        f"tokens-made:user:{request.user.pk}", f"{TOKENS_PER_DAY}/d"
    )
    if waits:
        refused, status = (
            f"No token was created: at most {TOKENS_PER_DAY} are made a day; try again tomorrow.",
            429,
        )
    elif request.method == "POST":
        label = request.POST.get("label", "").strip()[:80] or "token"
        try:
            _, token = services.create_api_token(
                user=request.user, label=label, days=request.POST.get("days"),
                read_only=bool(request.POST.get("read_only")),
            )  # fmt: skip
        except (services.TooManyTokens, services.BadTokenDays) as exc:
            refused, status = (
                f"No token was created: {exc}.",
                422 if isinstance(exc, services.BadTokenDays) else 409,
            )
        else:
            made = redirect("accounts:tokens")
            made.set_signed_cookie(
                NEW_TOKEN_COOKIE, f"{request.user.pk}:{token}", salt=NEW_TOKEN_SALT, max_age=NEW_TOKEN_COOKIE_S,
                path=reverse("accounts:tokens"), secure=request.is_secure(), httponly=True, samesite="Strict",
            )  # fmt: skip
            return made
    rows = ApiToken.objects.filter(user=request.user)
    context = {
        "tokens": rows, "new_token": new_token, "refused": refused, "day_choices": _day_choices(),
        "default_days": services.token_days(None), "most_days": settings.E31_TOKEN_MAX_DAYS,
        "api_docs": reverse("api:openapi-view"), "api_jobs": request.build_absolute_uri(reverse("api:list_jobs")),
    }  # fmt: skip
    page = render(request, "accounts/tokens.html", context, status=status)
    page.delete_cookie(NEW_TOKEN_COOKIE, path=reverse("accounts:tokens"), samesite="Strict")
    if waits:
        page["Retry-After"] = str(waits)
    return page


def _day_choices() -> list[int]:
    """The lengths offered: a week, a month, a quarter, a year, as far as E31_TOKEN_MAX_DAYS allows, and the most."""
    most = settings.E31_TOKEN_MAX_DAYS
    return sorted({d for d in (7, 30, 90, 365) if d <= most} | {most, services.token_days(None)})


def _new_token_shown(request: HttpRequest) -> str | None:
    """The token the last POST made, for this user, if its cookie came back within its time."""
    value = request.get_signed_cookie(
        NEW_TOKEN_COOKIE, default="", salt=NEW_TOKEN_SALT, max_age=NEW_TOKEN_COOKIE_S
    )
    user_id, _, token = value.partition(":")
    return token if token and user_id == str(request.user.pk) else None


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
    elif team_secrets.delete_secret(team=team, name=name, user=request.user, now=timezone.now()):
        messages.success(request, f"{team.name}: secret {name} deleted.")
    return redirect("accounts:secrets")


# --- Team members ---------------------------------------------------------------------------------

# Per admin, over all their teams: each invitation sends an e-mail to an address the admin typed, so the page
# must not become a way to mail strangers at volume.
INVITE_LIMIT, INVITE_WINDOW_S = 20, 3600


@login_required
def members_home(request: HttpRequest) -> HttpResponse:
    """The menu's Members: the first of the user's teams (the page links the others)."""
    team = Team.objects.filter(memberships__user=request.user).order_by("name").first()
    if team is None:
        return render(request, "jobs/no_team.html", status=403)
    return redirect("accounts:members", team_slug=team.slug)


@login_required
def team_members(request: HttpRequest, team_slug: str) -> HttpResponse:
    """Everyone in the team, for any member; a team admin also invites, changes roles and removes."""
    team = _team_or_404(request, team_slug)
    if request.method != "POST":
        return _members_page(request, team)
    if not scoping.is_team_admin(request.user, team):
        return _members_page(request, team, error=ONLY_ADMINS, status=403)
    form = forms.InviteForm(request.POST)
    if not form.is_valid():
        return _members_page(request, team, form=form, status=422)
    if ratelimit.hit(f"team-invite:{request.user.pk}", window_s=_invite_window_s()) > _invite_limit():
        response = _members_page(request, team, form=form, error=TOO_MANY, status=429)
        response["Retry-After"] = str(_invite_window_s())
        return response
    return _invite(request, team, form)


ONLY_ADMINS = "only a team admin changes the team's members"
TOO_MANY = "you have sent too many invitations for now: try again later"


def _invite_limit() -> int:
    return getattr(settings, "E31_TEAM_INVITE_LIMIT", INVITE_LIMIT)


def _invite_window_s() -> int:
    return getattr(settings, "E31_TEAM_INVITE_WINDOW_S", INVITE_WINDOW_S)


def _invite(request: HttpRequest, team: Team, form: forms.InviteForm) -> HttpResponse:
    email = form.cleaned_data["email"]
    try:
        invited = members.invite_member(team=team, email=email, actor=request.user, now=timezone.now())
    except members.NotTeamAdmin as exc:
        return _members_page(request, team, error=str(exc), status=403)
    except members.MembershipRefused as exc:
        return _members_page(request, team, form=form, error=str(exc), status=409)
    if invited.outcome == "member":
        messages.info(request, f"{invited.user.get_username()} is already a member of {team.name}.")
    else:
        _send_invitation(request, team, invited, request.user.get_username())
    return redirect("accounts:members", team_slug=team.slug)


def _send_invitation(request: HttpRequest, team: Team, invited: members.Invited, by: str) -> None:
    invitation = invited.invitation
    link = links.in_email(reverse("invite", args=[invited.token]))
    try:
        emails.team_invitation(
            email=invitation.email, team=team, by=by, link=link, expires_at=invitation.expires_at
        )
    except (SMTPException, OSError):
        # The token exists only now: if the mail cannot go, the admin passes the link on by hand.
        messages.warning(
            request, f"Invitation made, but the email could not be sent. Send this link yourself: {link}"
        )
        return
    messages.success(
        request,
        f"Invitation sent to {invitation.email}; the link works once, until {invitation.expires_at:%Y-%m-%d %H:%M} UTC.",
    )


@login_required
@require_POST
def change_member_role(request: HttpRequest, team_slug: str, user_id: int) -> HttpResponse:
    team = _team_or_404(request, team_slug)
    role = request.POST.get("role", "")
    return _change(request, team, members.change_role, user_id=user_id, role=role, done="role changed")


@login_required
@require_POST
def remove_member(request: HttpRequest, team_slug: str, user_id: int) -> HttpResponse:
    team = _team_or_404(request, team_slug)
    leaving = user_id == request.user.pk
    done = "you left the team" if leaving else "removed from the team"
    response = _change(request, team, members.remove_member, user_id=user_id, done=done, anyone=leaving)
    left = leaving and response.status_code == 302
    if left and not scoping.teams_of(request.user).filter(id=team.id).exists():
        # The team's pages are 404 to them from now on; their jobs list is theirs in any team or none.
        return redirect("jobs:list")
    return response


@login_required
@require_POST
def cancel_invitation(request: HttpRequest, team_slug: str, invitation_id: int) -> HttpResponse:
    team = _team_or_404(request, team_slug)
    return _change(
        request, team, members.cancel_invitation, invitation_id=invitation_id, done="invitation cancelled"
    )


def _change(
    request: HttpRequest, team: Team, service, *, done: str, anyone: bool = False, **arguments
) -> HttpResponse:
    """Calls one members writer (an admin's, unless ``anyone``: a member leaving); a refusal re-renders the page with
    its reason (403 not an admin, 409 else)."""
    if not anyone and not scoping.is_team_admin(request.user, team):
        return _members_page(request, team, error=ONLY_ADMINS, status=403)
    try:
        changed = service(team=team, actor=request.user, now=timezone.now(), **arguments)
    except members.NotTeamAdmin as exc:
        return _members_page(request, team, error=str(exc), status=403)
    except members.MembershipRefused as exc:
        return _members_page(request, team, error=str(exc), status=409)
    if changed:
        messages.success(request, f"{team.name}: {done}.")
    return redirect("accounts:members", team_slug=team.slug)


def _team_or_404(request: HttpRequest, team_slug: str) -> Team:
    # Another team's page does not exist for a non-member: the same 404 as a slug no team has.
    team = scoping.teams_of(request.user).filter(slug=team_slug).first()
    if team is None:
        raise Http404("No such object")
    return team


def _members_page(
    request: HttpRequest, team: Team, *, form=None, error: str = "", status: int = 200
) -> HttpResponse:
    is_admin = scoping.is_team_admin(request.user, team)
    context = {
        "team": team,
        "teams": Team.objects.filter(memberships__user=request.user).order_by("name"),
        "rows": selectors.team_members(team),
        "is_admin": is_admin,
        "sole_admin": selectors.sole_admin(team) if is_admin else None,
        "invitations": selectors.open_invitations(team) if is_admin else [],
        "form": form or forms.InviteForm(),
        "error": error,
        "now": timezone.now(),
    }
    return render(request, "accounts/members.html", context, status=status)
