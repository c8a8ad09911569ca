"""Plain-text emails to applicants, sent through Django's email backend (the console in development)."""

from django.core.mail import send_mail
from django.template.loader import render_to_string

from public.models import Application, WaitlistEntry


def _send(*, to: str, subject: str, template: str, context: dict, connection=None) -> None:
    body = render_to_string(template, context)
    send_mail(subject, body, None, [to], fail_silently=False, connection=connection)


def application_received(*, application: Application) -> None:
    _send(
        to=application.email,
        subject="E31 Network: we received your design-partner application",
        template="pages/email/application_received.txt",
        context={"application": application},
    )


def invitation(*, application: Application, link: str, expires_at) -> None:
    _send(
        to=application.email,
        subject="E31 Network: your design-partner application was accepted",
        template="pages/email/invitation.txt",
        context={"application": application, "link": link, "expires_at": expires_at},
    )


def application_declined(*, application: Application) -> None:
    _send(
        to=application.email,
        subject="E31 Network: about your design-partner application",
        template="pages/email/declined.txt",
        context={"application": application},
    )


def intake_open(*, entry: WaitlistEntry, page: str, connection=None) -> None:
    _send(
        to=entry.email,
        subject="E31 Network: design-partner intake is open",
        template="pages/email/intake_open.txt",
        context={"page": page},
        connection=connection,
    )
