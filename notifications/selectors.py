"""Reads for the notification pages and the API; never write."""

from django.db.models import Prefetch, QuerySet

from accounts import scoping
from accounts.models import Team
from notifications.models import EmailChoice, EmailPreference, Webhook, WebhookAttempt, WebhookDelivery


def email_choices(user) -> list[tuple[Team, str]]:
    """Each of the user's teams with their e-mail choice (never, when none was made)."""
    chosen = dict(EmailPreference.objects.filter(user=user).values_list("team_id", "email"))
    return [
        (team, chosen.get(team.id, EmailChoice.NEVER)) for team in scoping.teams_of(user).order_by("name")
    ]


def team_webhooks(team: Team) -> QuerySet[Webhook]:
    return Webhook.objects.filter(team=team).select_related("created_by").order_by("id")


def team_deliveries(team: Team) -> QuerySet[WebhookDelivery]:
    """The team's deliveries, newest first, each with its tries (a page is read in three queries)."""
    return (
        WebhookDelivery.objects.filter(webhook__team=team)
        .select_related("webhook")
        .prefetch_related(Prefetch("tries", queryset=WebhookAttempt.objects.order_by("number")))
        .order_by("-created_at", "-id")
    )
