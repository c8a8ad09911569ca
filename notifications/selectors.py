"""Reads for the notification pages and the API; never write."""

from django.db.models import Prefetch, QuerySet

from accounts import scoping, selectors
from accounts.models import Team
from notifications.models import EmailChoice, EmailPreference, Webhook, WebhookAttempt, WebhookDelivery


def email_choices(user) -> list[tuple[Team, str]]:
    """Each of the user's teams with their e-mail choice (never, when none was made)."""
    chosen = dict(EmailPreference.objects.filter(user=user).values_list("team_id", "email"))
    return [
        (team, chosen.get(team.id, EmailChoice.NEVER)) for team in scoping.teams_of(user).order_by("name")
    ]


def team_webhooks(team: Team) -> list[tuple[Webhook, bool]]:
    """The team's webhooks, each with whether it is sent to: only while its adder still speaks for the team."""
    hooks = Webhook.objects.filter(team=team).select_related("created_by").order_by("id")
    return [(hook, selectors.speaks_for(hook.created_by, team)) for hook in hooks]


def team_deliveries(team: Team) -> QuerySet[WebhookDelivery]:
    """The team's deliveries, newest first, each with its tries (a page is read in three queries)."""
    return (
        WebhookDelivery.objects.filter(webhook__team=team)
        .select_related("webhook")
        .prefetch_related(Prefetch("tries", queryset=WebhookAttempt.objects.order_by("number")))
        .order_by("-created_at", "-id")
    )
