"""The notification pages: a member's e-mail choices, and a team's webhooks with every delivery."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_http_methods, require_POST

from accounts import scoping
from common import paging
from notifications import addresses, selectors, services
from notifications.models import EmailChoice, Webhook

PAGE_SIZE = 25


@login_required
@require_http_methods(["GET", "POST"])
def email_settings(request: HttpRequest) -> HttpResponse:
    """Per team: e-mail when my job ends, only when it fails, or never."""
    if request.method == "POST":
        for team in scoping.teams_of(request.user):
            choice = request.POST.get(f"team-{team.id}")
            if choice is not None:
                try:
                    services.set_email_preference(user=request.user, team=team, email=choice)
                except services.NotAllowed as exc:
                    messages.error(request, f"{team.name}: {exc}")
                    return redirect("notifications:settings")
        messages.success(request, "E-mail choices saved.")
        return redirect("notifications:settings")
    context = {"rows": selectors.email_choices(request.user), "choices": EmailChoice.choices}
    return render(request, "notifications/settings.html", context)


@sensitive_post_parameters("secret")  # never in an error report
@login_required
@require_http_methods(["GET", "POST"])
def webhooks(request: HttpRequest, team_slug: str) -> HttpResponse:
    """The team's webhooks and each delivery with its response; its admins add one here."""
    team = scoping.teams_of(request.user).filter(slug=team_slug).first()
    if team is None:
        raise Http404("No such team")
    context: dict = {"team": team, "new_secret": "", "error": "", "url": ""}
    status = 200
    if request.method == "POST":
        context["url"] = request.POST.get("url", "").strip()
        try:
            hook = services.add_webhook(team=team, user=request.user, url=context["url"],
                                        secret=request.POST.get("secret", ""), now=timezone.now())  # fmt: skip
            context.update(new_secret=hook.secret, url="")
        except (addresses.Refused, services.NotAllowed) as exc:
            context["error"], status = str(exc), 422
    context.update(
        hooks=selectors.team_webhooks(team),
        can_manage=scoping.is_team_admin(request.user, team),
        keep_days=settings.E31_WEBHOOK_KEEP_DAYS,
        now=timezone.now(),
        page=paging.CappedPaginator(selectors.team_deliveries(team), PAGE_SIZE).get_page(
            request.GET.get("page")
        ),
    )
    return render(request, "notifications/webhooks.html", context, status=status)


@login_required
@require_POST
def remove_webhook(request: HttpRequest, team_slug: str, webhook_id: int) -> HttpResponse:
    hook = scoping.get_visible_or_404(
        request.user, Webhook.objects.select_related("team"), id=webhook_id, team__slug=team_slug
    )
    try:
        services.remove_webhook(webhook=hook, user=request.user, now=timezone.now())
        messages.success(request, "Webhook removed.")
    except services.NotAllowed as exc:
        messages.error(request, str(exc))
    return redirect("notifications:webhooks", team_slug=team_slug)
