"""Plain-text emails about a team's members, sent through Django's email backend (the console in development)."""

from datetime import datetime

from django.core.mail import send_mail
from django.template.loader import render_to_string

from accounts.models import Team


def _send(*, to: str, subject: str, template: str, context: dict) -> None:
    send_mail(subject, render_to_string(template, context), None, [to], fail_silently=False)


def team_invitation(*, email: str, team: Team, by: str, link: str, expires_at: datetime) -> None:
    _send(
        to=email,
        subject=f"E31 Network: {by} invites you to team {team.name}",
        template="accounts/email/team_invitation.txt",
        context={"team": team, "by": by, "link": link, "expires_at": expires_at},
    )
