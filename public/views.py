"""Public pages (home, unsolved problems, design-partner intake, invitations) and the operators' pages."""

import json
import logging
import shlex
from pathlib import PurePath
from smtplib import SMTPException
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth import login
from django.core.paginator import Paginator
from django.db import IntegrityError
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_http_methods, require_POST

from accounts import members
from accounts import selectors as accounts_selectors
from common import links
from common.operators import operator_only
from common.ratelimit import limit_posts
from public import emails, forms, selectors, services
from public.models import Application, Problem, ProblemRevision, WaitlistEntry

logger = logging.getLogger(__name__)


def home(request: HttpRequest) -> HttpResponse:
    return render(request, "pages/home.html")


# --- The unsolved-problems page -------------------------------------------------------------------


def _with_history(problems) -> list[Problem]:
    return list(
        problems.prefetch_related(
            Prefetch("revisions", queryset=ProblemRevision.objects.order_by("at", "id"))
        )
    )


def _figure_text(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def _public_command(command: str) -> str:
    """The command as readers see it: each trace by its file name. The row keeps the path as the operator
    gave it (often absolute, on their machine), which is theirs, not the public page's."""
    try:
        words = shlex.split(command)
    except ValueError:  # not written by shlex.join: shown as stored
        return command
    after_trace = {i + 1 for i, word in enumerate(words[:-1]) if word == "--trace"}
    return shlex.join(PurePath(w).name if i in after_trace else w for i, w in enumerate(words))


# Figures shown as tables and a list of assumptions, not as name/value pairs (record_simulation --declarations).
TABULAR = ("traces", "assumptions")


def _attach_measurements(problems: list[Problem]) -> None:
    """Each problem gets ``measured``: per key, the latest stored measurement (or None) and its figures."""
    latest = selectors.latest_measurements(key for problem in problems for key in problem.measurement_keys)
    for problem in problems:
        problem.measured = [_measured(key, latest.get(key)) for key in problem.measurement_keys]


def _measured(key: str, m) -> dict:
    figures = m.figures if m else {}
    return {
        "key": key,
        "m": m,
        "command": _public_command(m.command) if m else "",
        "rows": [(name, _figure_text(v)) for name, v in figures.items() if name not in TABULAR],
        "tables": [
            t for t in figures.get("traces", []) if isinstance(t, dict) and isinstance(t.get("rows"), list)
        ],
        "assumptions": [a for a in figures.get("assumptions", []) if isinstance(a, str)],
    }


def unsolved(request: HttpRequest) -> HttpResponse:
    problems = _with_history(Problem.objects.all())
    _attach_measurements(problems)
    context = {
        "open_problems": [p for p in problems if not p.is_solved],
        "solved_problems": sorted(
            (p for p in problems if p.is_solved), key=lambda p: p.solved_on, reverse=True
        ),
    }
    return render(request, "pages/unsolved.html", context)


# --- Operators: editing problems ------------------------------------------------------------------


def _render_problem_form(request: HttpRequest, context: dict, *, status: int = 200) -> HttpResponse:
    # The htmx Preview button swaps in the preview alone (its errors included, with 200 because htmx
    # does not swap a 4xx); without JavaScript the whole page comes back.
    if request.htmx and request.POST.get("action") == "preview":
        return render(request, "pages/problem_form.html#problem-preview", context)
    return render(request, "pages/problem_form.html", context, status=status)


def _preview_of(form: forms.ProblemForm, base: Problem | None) -> Problem:
    """An unsaved problem as the edit would make it read."""
    data = form.cleaned_data
    problem = Problem(
        slug=base.slug if base else "preview",
        status=base.status if base else Problem.Status.OPEN,
        solution=base.solution if base else "",
        solved_on=base.solved_on if base else None,
        added_at=base.added_at if base else timezone.now(),
        reviewed_at=timezone.now(),
        **{
            name: data[name]
            for name in ("title", "summary", "why_hard", "open_questions", "measurement_keys")
        },
    )
    return problem


@operator_only
@require_http_methods(["GET", "POST"])
def problem_new(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _render_problem_form(request, {"form": forms.ProblemForm(), "mode": "new"})
    form = forms.ProblemForm(request.POST)
    if not form.is_valid():
        return _render_problem_form(request, {"form": form, "mode": "new"}, status=422)
    if request.POST.get("action") == "preview":
        return _render_problem_form(
            request, {"form": form, "mode": "new", "preview": _preview_of(form, None)}
        )
    problem = services.add_problem(
        **form.cleaned_data, author=request.user.get_username(), now=timezone.now()
    )
    messages.success(request, f"Added “{problem.title}” to the open problems.")
    return redirect(f"{reverse('unsolved')}#problem-{problem.slug}")


@operator_only
@require_http_methods(["GET", "POST"])
def problem_edit(request: HttpRequest, slug: str) -> HttpResponse:
    problem = get_object_or_404(Problem, slug=slug)
    context = {"problem": problem, "mode": "edit"}
    if request.method == "GET":
        return _render_problem_form(request, {**context, "form": forms.ProblemForm.for_problem(problem)})
    form = forms.ProblemForm(request.POST)
    if not form.is_valid():
        return _render_problem_form(request, {**context, "form": form}, status=422)
    if request.POST.get("action") == "preview":
        return _render_problem_form(request, {**context, "form": form, "preview": _preview_of(form, problem)})
    revision = services.reword_problem(
        problem_id=problem.id, **form.cleaned_data, author=request.user.get_username(), now=timezone.now()
    )
    if revision is None:
        messages.info(request, "Nothing changed, so nothing was recorded.")
    else:
        messages.success(request, f"Reworded “{revision.title}”; the edit is in its history and the feed.")
    return redirect(f"{reverse('unsolved')}#problem-{problem.slug}")


@operator_only
@require_http_methods(["GET", "POST"])
def problem_solve(request: HttpRequest, slug: str) -> HttpResponse:
    problem = get_object_or_404(Problem, slug=slug)
    context = {"problem": problem, "mode": "solve"}
    if problem.is_solved:
        messages.info(request, "This problem is already marked solved.")
        return redirect(f"{reverse('unsolved')}#problem-{problem.slug}")
    if request.method == "GET":
        form = forms.SolveForm(initial={"solved_on": timezone.now().date()})
        return _render_problem_form(request, {**context, "form": form})
    form = forms.SolveForm(request.POST)
    if not form.is_valid():
        return _render_problem_form(request, {**context, "form": form}, status=422)
    if request.POST.get("action") == "preview":
        preview = Problem(**{f.attname: getattr(problem, f.attname) for f in Problem._meta.concrete_fields})
        preview.status, preview.solution = Problem.Status.SOLVED, form.cleaned_data["solution"]
        preview.solved_on = form.cleaned_data["solved_on"]
        return _render_problem_form(request, {**context, "form": form, "preview": preview})
    services.mark_problem_solved(
        problem_id=problem.id, **form.cleaned_data, author=request.user.get_username(), now=timezone.now()
    )
    messages.success(request, f"Marked “{problem.title}” solved; it stays on the page under Solved.")
    return redirect(f"{reverse('unsolved')}#problem-{problem.slug}")


@operator_only
@require_POST
def problem_reviewed(request: HttpRequest, slug: str) -> HttpResponse:
    problem = get_object_or_404(Problem, slug=slug)
    services.mark_problem_reviewed(
        problem_id=problem.id, author=request.user.get_username(), now=timezone.now()
    )
    messages.success(request, f"Recorded a review of “{problem.title}”.")
    return redirect(f"{reverse('unsolved')}#problem-{problem.slug}")


# --- Design-partner intake (public) ---------------------------------------------------------------


def _render_partners(request: HttpRequest, form, *, status: int = 200, kept=()) -> HttpResponse:
    """The page with ``form``: the application's while intake is open, else the waitlist's (beside ``kept``, the
    answers of an application sent just after intake closed, shown back so that they are not lost)."""
    context = {
        "intake_open": isinstance(form, forms.ApplicationForm),
        "form": form,
        "honeypot": forms.HONEYPOT,
        "kept": kept,
    }
    return render(request, "pages/partners.html", context, status=status)


def _kept_answers(request: HttpRequest) -> list[tuple[str, str]]:
    """(label, what was typed) for each filled field of an application that could not be taken."""
    fields = forms.ApplicationForm.base_fields
    return [
        (str(field.label or name.replace("_", " ").capitalize()), request.POST.get(name, "")[:4000])
        for name, field in fields.items()
        if name != "problems" and request.POST.get(name, "").strip()
    ]


def _thanks(kind: str) -> HttpResponse:
    return redirect(f"{reverse('partners-thanks')}?for={kind}")


@limit_posts()
@require_http_methods(["GET", "POST"])
def partners(request: HttpRequest) -> HttpResponse:
    is_open = selectors.intake_is_open()
    if request.method == "GET":
        return _render_partners(request, forms.ApplicationForm() if is_open else forms.WaitlistForm())
    kind = "application" if request.POST.get("form") == "application" else "waitlist"
    if request.POST.get(forms.HONEYPOT):
        return _thanks(kind)  # looks accepted to the bot; nothing is saved or sent
    if kind == "waitlist":
        return _join_waitlist(request, is_open=is_open)
    if not is_open:
        messages.warning(
            request,
            "Intake closed while you were filling in the form; nothing was saved. What you wrote is below, so "
            "that it is not lost; join the waitlist to hear when intake opens again.",
        )
        return _render_partners(request, forms.WaitlistForm(), status=409, kept=_kept_answers(request))
    return _apply(request)


def _join_waitlist(request: HttpRequest, *, is_open: bool) -> HttpResponse:
    form = forms.WaitlistForm(request.POST)
    if not form.is_valid() and is_open:  # a page loaded while intake was closed: it has opened since
        messages.info(request, "Intake is open now: apply below instead of joining the waitlist.")
        return _render_partners(request, forms.ApplicationForm(), status=422)
    if not form.is_valid():
        return _render_partners(request, form, status=422)
    services.join_waitlist(**form.cleaned_data, now=timezone.now())
    return _thanks("waitlist")


def _apply(request: HttpRequest) -> HttpResponse:
    form = forms.ApplicationForm(request.POST)
    if not form.is_valid():
        return _render_partners(request, form, status=422)
    data = dict(form.cleaned_data)
    problem_ids = [p.id for p in data.pop("problems")]
    application, created = services.submit_application(**data, problem_ids=problem_ids, now=timezone.now())
    if not created:
        return _thanks("application")  # sent again: the first is under review, and was confirmed once
    try:
        emails.application_received(application=application)
    except (SMTPException, OSError):
        # The application is saved and operators see it; a mail outage must not turn that into an error page.
        logger.warning("confirmation email to application %s failed", application.id, exc_info=True)
    return _thanks("application")


def partners_thanks(request: HttpRequest) -> HttpResponse:
    kind = "application" if request.GET.get("for") == "application" else "waitlist"
    return render(request, "pages/partners_thanks.html", {"kind": kind})


# --- Operators: review ----------------------------------------------------------------------------

PENDING_PER_PAGE = 50
WAITLIST_PER_PAGE = 200


@operator_only
def partners_review(request: HttpRequest) -> HttpResponse:
    applications = Application.objects.prefetch_related("problems")
    pending = applications.filter(status=Application.Status.PENDING).order_by("created_at", "id")
    context = {
        "intake_open": selectors.intake_is_open(),
        # Oldest first, a page at a time: an open intake can gather more than one page can show.
        "pending": Paginator(pending, PENDING_PER_PAGE).get_page(request.GET.get("page")),
        "decided": applications.exclude(status=Application.Status.PENDING)[:50],
        "waitlist": Paginator(WaitlistEntry.objects.all(), WAITLIST_PER_PAGE).get_page(
            request.GET.get("waitlist_page")
        ),
        "waitlist_told": WaitlistEntry.objects.exclude(told_at=None).count(),
        "waitlist_untold": WaitlistEntry.objects.filter(told_at=None).count(),  # whom opening intake e-mails
    }
    return render(request, "pages/partners_review.html", context)


@operator_only
@require_POST
def partners_intake(request: HttpRequest) -> HttpResponse:
    is_open = request.POST.get("open") == "1"
    services.set_intake_open(is_open=is_open, by=request.user.get_username(), now=timezone.now())
    messages.success(request, "Design-partner intake is now " + ("open." if is_open else "closed."))
    return redirect("partners-review")


def _render_application(
    request: HttpRequest, application: Application, *, status: int = 200, **forms_
) -> HttpResponse:
    context = {
        "application": application,
        "accept_form": forms_.get("accept_form")
        or forms.AcceptForm(initial={"team_name": application.team_name}),
        "decline_form": forms_.get("decline_form") or forms.DeclineForm(),
        "now": timezone.now(),
    }
    return render(request, "pages/partners_application.html", context, status=status)


@operator_only
def partners_application(request: HttpRequest, application_id: int) -> HttpResponse:
    application = get_object_or_404(Application.objects.prefetch_related("problems"), id=application_id)
    return _render_application(request, application)


@operator_only
@require_POST
def partners_accept(request: HttpRequest, application_id: int) -> HttpResponse:
    application = get_object_or_404(Application, id=application_id)
    form = forms.AcceptForm(request.POST)
    if not form.is_valid():
        return _render_application(request, application, status=422, accept_form=form)
    now = timezone.now()
    try:
        application, token = services.accept_application(
            application_id=application.id,
            team_name=form.cleaned_data["team_name"],
            by=request.user.get_username(),
            now=now,
        )
    except services.IntakeError as exc:
        messages.error(request, str(exc))
        return redirect("partners-application", application_id=application.id)
    except IntegrityError:  # another accept created a team of that name a moment ago
        messages.error(request, "A team with this name was just created: choose another name.")
        return redirect("partners-application", application_id=application.id)
    link = links.in_email(reverse("invite", args=[token]))
    _send_invitation(request, application, link)
    return redirect("partners-application", application_id=application.id)


@operator_only
@require_POST
def partners_reinvite(request: HttpRequest, application_id: int) -> HttpResponse:
    application = get_object_or_404(Application, id=application_id)
    try:
        application, token = services.reissue_invitation(
            application_id=application.id, by=request.user.get_username(), now=timezone.now()
        )
    except services.IntakeError as exc:
        messages.error(request, str(exc))
        return redirect("partners-application", application_id=application.id)
    link = links.in_email(reverse("invite", args=[token]))
    try:
        emails.invitation(application=application, link=link, expires_at=application.invitation.expires_at)
    except (SMTPException, OSError):
        messages.warning(
            request, f"A new link was made, but the email could not be sent. Send it yourself: {link}"
        )
    else:
        messages.success(
            request, f"A new invitation link was sent to {application.email}; the old one no longer works."
        )
    return redirect("partners-application", application_id=application.id)


def _send_invitation(request: HttpRequest, application: Application, link: str) -> None:
    try:
        emails.invitation(application=application, link=link, expires_at=application.invitation.expires_at)
    except (SMTPException, OSError):
        # The token exists only now: if the mail cannot go, the operator passes the link on by hand.
        messages.warning(
            request, f"Accepted, but the email could not be sent. Send this link yourself: {link}"
        )
        return
    messages.success(
        request, f"Accepted: team “{application.team.name}” created, invitation sent to {application.email}."
    )


@operator_only
@require_POST
def partners_decline(request: HttpRequest, application_id: int) -> HttpResponse:
    application = get_object_or_404(Application, id=application_id)
    form = forms.DeclineForm(request.POST)
    if not form.is_valid():
        return _render_application(request, application, status=422, decline_form=form)
    try:
        application = services.decline_application(
            application_id=application.id,
            note=form.cleaned_data["note"],
            by=request.user.get_username(),
            now=timezone.now(),
        )
    except services.IntakeError as exc:
        messages.error(request, str(exc))
        return redirect("partners-application", application_id=application.id)
    try:
        emails.application_declined(application=application)
    except (SMTPException, OSError):
        messages.warning(request, "Declined, but the email to the applicant could not be sent.")
    else:
        messages.success(request, f"Declined; {application.email} was told, with your note.")
    return redirect("partners-application", application_id=application.id)


# --- Invitations ----------------------------------------------------------------------------------

# As Django's password-reset confirmation does: opening a link moves it out of the URL at once, and the page that
# asks for a password is served (and its form posted) at this fixed path instead. Every refusal there (a 422 for a
# mistyped confirmation, a 403 for a stale CSRF cookie, a 429) is logged with its path, by django.request and
# common.denials, and a live token in a log would open the invitation to its reader. The session keeps the token's
# SHA-256, as the invitation's row does, never the token: sessions are rows in the database too.
LINK_PLACEHOLDER = "set-password"
LINK_SESSION_KEY = "_e31_invitation_digest"
# The session holds one link per browser, the last opened; the form says which invitation it was filled in for,
# so a page opened before another link was opened in another tab never redeems that other invitation.
FORM_KEY = "invitation"


def _refused(request: HttpRequest, reason: str = "") -> HttpResponse:
    # One answer for unknown, altered, used and expired links: the page reveals nothing about which.
    return render(request, "pages/invite.html", {"refused": True, "reason": reason}, status=410)


def _form_key(invitation) -> str:
    return f"{invitation._meta.model_name}-{invitation.pk}"


def _opened_link(request: HttpRequest) -> str:
    """The link this browser opened (its digest), which counts the posts to its page: counted per address, the
    colleagues of one office (one address behind its NAT) shared five posts in ten minutes."""
    digest = request.session.get(LINK_SESSION_KEY, "")
    return f"link:{digest}" if digest else ""


@sensitive_post_parameters("password1", "password2")
@limit_posts(scope="invite", counted_by=_opened_link)
@require_http_methods(["GET", "POST"])
def invite(request: HttpRequest, token: str) -> HttpResponse:
    if token != LINK_PLACEHOLDER:
        return _open_link(request, token)
    digest = request.session.get(LINK_SESSION_KEY, "")
    if not digest:
        return _refused(request, "open the link in your e-mail again, in this browser")
    invitation = selectors.invitation_for_link(digest=digest, now=timezone.now())
    if invitation is None:
        return _refused(request)
    if request.method == "POST" and request.POST.get(FORM_KEY) != _form_key(invitation):
        # Nothing is changed: 409, and the page says how to get the form for the invitation meant.
        return render(request, "pages/invite.html", {"superseded": True}, status=409)
    if reason := selectors.why_link_unusable(invitation):
        return _refused(request, reason)  # before the form: no password is asked for in vain
    context = {"invitation": invitation, "form_key": _form_key(invitation)}
    if (account := accounts_selectors.invited_account(invitation)) is not None:
        return _join(request, account, digest=digest, context=context)
    if request.method == "GET":
        form = forms.SetPasswordForm(email=invitation.email)
        return render(request, "pages/invite.html", {**context, "form": form})
    form = forms.SetPasswordForm(request.POST, email=invitation.email)
    if not form.is_valid():
        return render(request, "pages/invite.html", {**context, "form": form}, status=422)
    return _redeem(request, invitation, digest=digest, password=form.cleaned_data["password1"])


def _open_link(request: HttpRequest, token: str) -> HttpResponse:
    digest = accounts_selectors.link_digest(token)
    invitation = selectors.invitation_for_link(digest=digest, now=timezone.now())
    if invitation is None:
        return _refused(request)  # a token that opens nothing gives nothing away where it is logged
    request.session[LINK_SESSION_KEY] = digest
    return redirect("invite", token=LINK_PLACEHOLDER)


def _redeem(request: HttpRequest, invitation, *, digest: str, password: str) -> HttpResponse:
    try:
        user = services.redeem_invitation(digest=digest, password=password, now=timezone.now())
    except services.InvitationRefused as exc:
        return _refused(request, str(exc))
    request.session.pop(LINK_SESSION_KEY, None)
    login(request, user, backend="accounts.backends.UsernameOrEmailBackend")
    if invitation.role == "admin":
        messages.success(request, f"Welcome. You are the admin of team “{invitation.team.name}”.")
    else:
        messages.success(request, f"Welcome. You are a member of team “{invitation.team.name}”.")
    return redirect("jobs:list")


def _join(request: HttpRequest, account, *, digest: str, context: dict) -> HttpResponse:
    """A team's link for an address that has an account: that account joins, signed in, by pressing Join."""
    if (page := _join_page(request, account, context)) is not None:
        return page
    invitation = context["invitation"]
    try:
        members.accept_team_invitation(digest=digest, user=request.user, now=timezone.now())
    except members.InvitationRefused as exc:
        return _refused(request, str(exc))
    request.session.pop(LINK_SESSION_KEY, None)
    messages.success(request, f"You joined team “{invitation.team.name}” as a member.")
    return redirect("accounts:members", team_slug=invitation.team.slug)


def _join_page(request: HttpRequest, account, context: dict) -> HttpResponse | None:
    """The page for anything but that account pressing Join; None when it did. Nothing is changed here: a POST
    that is not the Join (a password form filled in before an account took the address, say) gets 409 and the
    page as it now reads, and anyone signed in as another account 403."""
    posted = request.method == "POST"
    status = 409 if posted else 200
    if not request.user.is_authenticated:
        # The link stays in the session through sign-in (a signed-out session keeps its data), so `next` is enough.
        sign_in = f"{reverse('accounts:login')}?{urlencode({'next': request.path}, safe='/')}"
        return render(request, "pages/invite.html", {**context, "sign_in": sign_in}, status=status)
    if request.user.pk != account.pk:
        reason = accounts_selectors.wrong_account_reason(context["invitation"], request.user)
        return render(request, "pages/invite.html", {**context, "wrong_account": reason}, status=403)
    if accounts_selectors.is_member(context["invitation"].team, account):
        return render(request, "pages/invite.html", {**context, "already_member": True}, status=status)
    if not posted or "join" not in request.POST:
        return render(request, "pages/invite.html", {**context, "confirm": True}, status=status)
    return None
