"""Writers for the public record and design-partner intake.

The only code that writes these models (but for an invitation's claim, ``accounts.members.claim_invitation``,
shared with the team admins' links): keyword-only arguments, one transaction each, ``now`` passed in.
"""

import json
import logging
import re
import secrets
from collections.abc import Iterable
from datetime import date, datetime, timedelta
from smtplib import SMTPException, SMTPRecipientsRefused
from typing import Any

from django.conf import settings
from django.core import mail
from django.db import transaction
from django.db.models import Max
from django.urls import reverse
from django.utils.text import slugify

from accounts import members
from accounts import services as accounts
from accounts.models import Membership
from common import links
from public import emails, selectors, signals
from public.models import (
    Application,
    IntakeChange,
    Invitation,
    Measurement,
    Problem,
    ProblemRevision,
    WaitlistEntry,
)

log = logging.getLogger(__name__)

MEASUREMENT_KEY = re.compile(
    r"[a-z0-9][a-z0-9_.-]{0,79}"
)  # with fullmatch: "$" lets a trailing newline through
MAX_FIGURES_BYTES = 20_000  # figures are a handful of numbers shown on a public page, not a raw dump
INVITATION_TTL_S = 7 * 86400


class IntakeError(Exception):
    """An intake step that cannot happen as asked; the message is meant for the person who asked."""


# One refusal for both kinds of link, a design partner's and a team admin's: the page shows its reason.
InvitationRefused = members.InvitationRefused


# --- Measurements ---------------------------------------------------------------------------------


@transaction.atomic
def record_measurement(*, key: str, title: str, figures: dict, command: str, now: datetime) -> Measurement:
    """Appends one measurement; the public page shows the latest per key. Rows are never changed."""
    if not MEASUREMENT_KEY.fullmatch(key):
        raise ValueError(f"measurement key {key!r}: lower-case letters, digits, '.', '_' or '-', at most 80")
    if not isinstance(figures, dict) or not figures:
        raise ValueError("figures must be a non-empty dict")
    if len(json.dumps(figures, default=str)) > MAX_FIGURES_BYTES:
        raise ValueError(f"figures must serialise to at most {MAX_FIGURES_BYTES} bytes of JSON")
    # Round-trip through JSON so what is stored is exactly what the page will show.
    stored = json.loads(json.dumps(figures, default=str))
    return Measurement.objects.create(
        key=key, title=title.strip()[:200] or key, figures=stored, command=command[:2000], measured_at=now
    )


# --- Unsolved problems ----------------------------------------------------------------------------

_WORDING = ("title", "summary", "why_hard", "open_questions", "measurement_keys")


def _revise(*, problem_id: int, kind: str, author: str, note: str, now: datetime) -> ProblemRevision:
    """Keeps the problem as it reads after this edit."""
    problem = Problem.objects.get(id=problem_id)
    return ProblemRevision.objects.create(
        problem=problem,
        kind=kind,
        at=now,
        author=author[:150],
        note=note[:300],
        status=problem.status,
        solution=problem.solution,
        solved_on=problem.solved_on,
        **{name: getattr(problem, name) for name in _WORDING},
    )


def _free_slug(title: str) -> str:
    base = slugify(title)[:70] or "problem"
    slug, n = base, 2
    while Problem.objects.filter(slug=slug).exists():
        slug, n = f"{base}-{n}", n + 1
    return slug


@transaction.atomic
def add_problem(
    *,
    title: str,
    summary: str,
    why_hard: str,
    open_questions: list[str],
    measurement_keys: list[str],
    author: str,
    now: datetime,
    note: str = "",
) -> Problem:
    """A new open problem, at the end of the list, with its 'added' revision."""
    position = (Problem.objects.aggregate(last=Max("position"))["last"] or 0) + 1
    problem = Problem.objects.create(
        slug=_free_slug(title),
        title=title,
        summary=summary,
        why_hard=why_hard,
        open_questions=list(open_questions),
        measurement_keys=list(measurement_keys),
        position=position,
        added_at=now,
        reviewed_at=now,
    )
    _revise(problem_id=problem.id, kind=ProblemRevision.Kind.ADDED, author=author, note=note, now=now)
    return problem


@transaction.atomic
def reword_problem(
    *,
    problem_id: int,
    title: str,
    summary: str,
    why_hard: str,
    open_questions: list[str],
    measurement_keys: list[str],
    note: str,
    author: str,
    now: datetime,
) -> ProblemRevision | None:
    """Rewords a problem and keeps the edit; None if nothing changed (no empty revisions)."""
    problem = Problem.objects.select_for_update().get(id=problem_id)
    wording = {
        "title": title,
        "summary": summary,
        "why_hard": why_hard,
        "open_questions": list(open_questions),
        "measurement_keys": list(measurement_keys),
    }
    if all(getattr(problem, name) == value for name, value in wording.items()):
        return None
    Problem.objects.filter(id=problem_id).update(**wording, reviewed_at=now)
    return _revise(
        problem_id=problem_id, kind=ProblemRevision.Kind.REWORDED, author=author, note=note, now=now
    )


@transaction.atomic
def mark_problem_solved(
    *, problem_id: int, solution: str, solved_on: date, author: str, now: datetime, note: str = ""
) -> ProblemRevision | None:
    """OPEN -> SOLVED with the solution and its date; None if it was already solved."""
    if not solution.strip():
        raise ValueError("a problem is marked solved only with a description of the solution")
    claimed = Problem.objects.filter(id=problem_id, status=Problem.Status.OPEN).update(
        status=Problem.Status.SOLVED, solution=solution, solved_on=solved_on, reviewed_at=now
    )
    if not claimed:
        return None
    return _revise(problem_id=problem_id, kind=ProblemRevision.Kind.SOLVED, author=author, note=note, now=now)


@transaction.atomic
def mark_problem_reviewed(*, problem_id: int, author: str, now: datetime, note: str = "") -> ProblemRevision:
    """Records that an operator read the problem again and it still stands as written."""
    Problem.objects.filter(id=problem_id).update(reviewed_at=now)
    return _revise(
        problem_id=problem_id, kind=ProblemRevision.Kind.REVIEWED, author=author, note=note, now=now
    )


# --- Design-partner intake ------------------------------------------------------------------------


@transaction.atomic
def set_intake_open(*, is_open: bool, by: str, now: datetime) -> IntakeChange:
    """Opens or closes intake; every change is kept, the latest wins."""
    return IntakeChange.objects.create(is_open=is_open, by=by[:150], at=now)


def tell_waitlist(*, now: datetime) -> int:
    """While intake is open, writes to those on the waitlist not yet told, at most E31_WAITLIST_MAILS_PER_RUN a run
    (beat runs it every minute, on the notify queue), over one connection to the relay; returns how many were sent.
    Each entry is claimed before its mail goes out, so two runs never write twice. An address the relay refuses
    for good stays claimed (told, as far as anyone can be), and the run goes on; a relay that fails releases the
    claim, and the run stops for the next."""
    if not selectors.intake_is_open():
        return 0
    page = links.in_email(reverse("partners"))
    sent = 0
    due = WaitlistEntry.objects.filter(told_at=None).order_by("created_at", "id")
    with mail.get_connection() as relay:
        for entry in due[: settings.E31_WAITLIST_MAILS_PER_RUN]:
            if not WaitlistEntry.objects.filter(id=entry.id, told_at=None).update(told_at=now):
                continue  # another run has it
            try:
                emails.intake_open(entry=entry, page=page, connection=relay)
            except SMTPRecipientsRefused:
                log.warning("waitlist: the relay refused entry %s's address; not tried again", entry.id)
                continue
            except (OSError, SMTPException):
                log.warning(
                    "waitlist: the mail to entry %s failed; tried at the next run", entry.id, exc_info=True
                )
                WaitlistEntry.objects.filter(id=entry.id).update(told_at=None)
                break
            sent += 1
    return sent


@transaction.atomic
def join_waitlist(*, email: str, note: str, now: datetime) -> WaitlistEntry:
    """One entry per address: signing up again keeps the first entry (and says nothing different)."""
    entry, _ = WaitlistEntry.objects.get_or_create(
        email=email.strip().lower(), defaults={"note": note[:500], "created_at": now}
    )
    return entry


@transaction.atomic
def submit_application(
    *,
    team_name: str,
    contact_name: str,
    email: str,
    work: str,
    data_bytes: int,
    data_location: str,
    compute_request: str,
    output: str,
    output_bytes: int,
    can_run_when: str,
    problem_ids: Iterable[int],
    now: datetime,
) -> tuple[Application, bool]:
    """A pending application, and whether it is new: one per address, so sending it again keeps the
    first (as the waitlist does). Refused while intake is closed. Only open problems can be ticked."""
    if not selectors.intake_is_open():
        raise IntakeError("design-partner intake is closed")
    application, created = Application.objects.get_or_create(
        email=email.strip().lower(),
        status=Application.Status.PENDING,
        defaults={
            "team_name": team_name,
            "contact_name": contact_name,
            "work": work,
            "data_bytes": data_bytes,
            "data_location": data_location,
            "compute_request": compute_request,
            "output": output,
            "output_bytes": output_bytes,
            "can_run_when": can_run_when,
            "created_at": now,
        },
    )
    if created:
        application.problems.set(Problem.objects.open().filter(id__in=list(problem_ids)))
    return application, created


@transaction.atomic
def accept_application(
    *, application_id: int, team_name: str, by: str, now: datetime
) -> tuple[Application, str]:
    """PENDING -> ACCEPTED: creates the team and a single-use invitation; returns the plain token once."""
    team_name = team_name.strip()
    if problem := selectors.team_name_problem(team_name):
        raise IntakeError(problem)
    email = Application.objects.values_list("email", flat=True).get(id=application_id)
    if selectors.has_account(email):
        # Its invitation would be refused at redemption, leaving a team nobody can join.
        raise IntakeError(
            f"{email} already has an account: nothing was accepted. Add that user to a team instead, "
            "or decline this application."
        )
    claimed = Application.objects.filter(id=application_id, status=Application.Status.PENDING).update(
        status=Application.Status.ACCEPTED, decided_at=now, decided_by=by[:150]
    )
    if not claimed:
        raise IntakeError("this application has already been decided")
    team = accounts.create_team(name=team_name)
    Application.objects.filter(id=application_id).update(team=team)
    members.announce_change(
        team, "team.create", {}, {"name": team.name, "application": application_id}, actor=by, now=now
    )
    application = Application.objects.get(id=application_id)
    token = secrets.token_urlsafe(32)
    Invitation.objects.create(
        application=application,
        team=team,
        email=application.email,
        digest=accounts.digest_token(token),
        created_at=now,
        expires_at=now + _invitation_ttl(),
    )
    return application, token


@transaction.atomic
def reissue_invitation(*, application_id: int, by: str, now: datetime) -> tuple[Application, str]:
    """A new link for an accepted contact whose invitation is unused (expired, or its mail lost): the old link
    stops working, the new one lasts the usual time, and who sent it is in the audit log (the link makes its
    holder the team's admin); returns the plain token once."""
    token = secrets.token_urlsafe(32)
    unused = Invitation.objects.select_for_update().filter(
        application_id=application_id, application__status=Application.Status.ACCEPTED, used_at__isnull=True
    )
    invitation = unused.first()
    if invitation is None:
        raise IntakeError("this application has no unused invitation: nothing was sent")
    expires_at = now + _invitation_ttl()
    unused.update(digest=accounts.digest_token(token), created_at=now, expires_at=expires_at)
    members.announce_change(
        invitation.team, "team.invitation-reissue", {"expires_at": invitation.expires_at.isoformat()},
        {"expires_at": expires_at.isoformat(), "email": invitation.email}, actor=by, now=now,
    )  # fmt: skip
    return Application.objects.select_related("invitation", "team").get(id=application_id), token


def _invitation_ttl() -> timedelta:
    # Read at call time so an environment (or a test) can shorten it without a code change.
    return timedelta(seconds=getattr(settings, "E31_INVITATION_TTL_S", INVITATION_TTL_S))


@transaction.atomic
def decline_application(*, application_id: int, note: str, by: str, now: datetime) -> Application:
    """PENDING -> DECLINED with the operators' note."""
    claimed = Application.objects.filter(id=application_id, status=Application.Status.PENDING).update(
        status=Application.Status.DECLINED, decided_at=now, decided_by=by[:150], decision_note=note[:1000]
    )
    if not claimed:
        raise IntakeError("this application has already been decided")
    signals.application_declined.send(
        sender=Application, application_id=application_id, note=note[:1000], actor=by, now=now
    )
    return Application.objects.get(id=application_id)


@transaction.atomic
def redeem_invitation(*, digest: str, password: str, now: datetime) -> Any:
    """Uses the invitation whose link has this digest once: creates the contact's account and makes it the team's
    admin; a team admin's invitation (``accounts.members``) makes a member instead."""
    invitation = selectors.usable_invitation(digest=digest, now=now)
    if invitation is None:
        return members.redeem_team_invitation(digest=digest, password=password, now=now)
    name = invitation.application.contact_name[:150]
    user = members.claim_invitation(invitation=invitation, password=password, first_name=name, now=now)
    accounts.add_member(team=invitation.team, user=user, role=Membership.Role.ADMIN)
    joined = {
        "member": user.get_username(),
        "role": Membership.Role.ADMIN,
        "accepted_by": invitation.application.decided_by,
    }
    members.announce_change(invitation.team, "team.member-join", {}, joined, actor=user, now=now)
    return user
