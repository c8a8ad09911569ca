"""Operators review applications; an accepted contact follows a single-use link into the console."""

import logging
import re
from datetime import timedelta

import pytest
import time_machine
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import mail
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts import members
from accounts import selectors as accounts_selectors
from accounts.models import Membership, Team
from operations.models import AuditEntry
from public import selectors, services
from public.models import Application, Invitation
from tests.pages.factories import ApplicationFactory, WaitlistEntryFactory, application_post

PASSWORD = "a long and unusual passphrase 31"
LINK = re.compile(re.escape(settings.E31_CONSOLE_URL) + r"(/invite/[^/\s]+/)")
FORM_KEY = re.compile(r'name="invitation" value="([^"]*)"')


def _accept(operator_client: Client, application: Application, team_name: str = "") -> str:
    """Accepts through the page and returns the invitation path from the email."""
    url = reverse("partners-accept", args=[application.id])
    operator_client.post(url, {"team_name": team_name or application.team_name})
    return LINK.search(mail.outbox[-1].body).group(1)


def _set_password(client: Client, path: str, password: str = PASSWORD, again: str | None = None):
    """Opens the link as its e-mail does (it moves into the session) and posts the form it leads to, with the
    field that says which invitation the form is for."""
    opened = client.get(path)
    form = opened["Location"] if opened.status_code == 302 else path
    filled = {"password1": password, "password2": again or password, **_form_key(client.get(form))}
    return client.post(form, filled)


def _form_key(page) -> dict[str, str]:
    found = FORM_KEY.search(page.content.decode())
    return {"invitation": found.group(1)} if found else {}


@pytest.mark.django_db
def test_operators_see_pending_applications_decided_ones_and_the_waitlist(operator_client):
    pending = ApplicationFactory(team_name="Footage Lab")
    ApplicationFactory(team_name="Old Lab", status="declined", decided_by="olga", decided_at=timezone.now())
    WaitlistEntryFactory(email="wait@example.com", note="later please")
    response = operator_client.get(reverse("partners-review"))
    html = response.content.decode()
    assert list(response.context["pending"]) == [pending]
    assert "Footage Lab" in html and "Old Lab" in html
    assert "wait@example.com" in html and "later please" in html
    assert "40.0 TB" in html or "40 TB" in html
    detail = operator_client.get(reverse("partners-application", args=[pending.id])).content.decode()
    assert "python render.py --backlog" in detail and "any weekend next month" in detail


@pytest.mark.django_db
def test_pending_applications_are_shown_a_page_at_a_time_oldest_first(operator_client):
    start = timezone.now() - timedelta(days=30)
    made = [
        ApplicationFactory(
            team_name=f"Lab {i:02d}", email=f"lab{i}@example.com", created_at=start + timedelta(hours=i)
        )
        for i in range(53)
    ]
    first = operator_client.get(reverse("partners-review"))
    assert list(first.context["pending"]) == made[:50]
    html = first.content.decode()
    assert "Waiting for a decision (53)" in html and "1\u201350 of 53, oldest first" in html
    second = operator_client.get(reverse("partners-review"), {"page": 2})
    assert list(second.context["pending"]) == made[50:]
    assert "Lab 52" in second.content.decode() and "Lab 00" not in second.content.decode()


@pytest.mark.django_db
def test_members_and_visitors_cannot_see_or_decide_applications(member_client, client, application):
    for url in (reverse("partners-review"), reverse("partners-application", args=[application.id])):
        assert member_client.get(url).status_code == 404
        assert client.get(url).status_code == 302
    assert (
        member_client.post(reverse("partners-accept", args=[application.id]), {"team_name": "x"}).status_code
        == 404
    )
    assert (
        member_client.post(reverse("partners-decline", args=[application.id]), {"note": "x"}).status_code
        == 404
    )
    application.refresh_from_db()
    assert application.status == "pending"


@pytest.mark.django_db
def test_accepting_creates_the_team_and_emails_a_link_whose_token_is_stored_only_as_a_hash(
    operator_client, application
):
    path = _accept(operator_client, application, team_name="Footage Lab Prime")
    application.refresh_from_db()
    assert (application.status, application.decided_by) == ("accepted", "olga")
    assert application.team == Team.objects.get(name="Footage Lab Prime")
    invitation = Invitation.objects.get()
    token = path.split("/")[2]
    assert token not in invitation.digest and len(invitation.digest) == 64
    assert timedelta(days=6) < invitation.expires_at - timezone.now() <= timedelta(days=7)
    assert mail.outbox[-1].to == [application.email]
    assert not Membership.objects.filter(
        team=application.team
    ).exists()  # nobody is in it until the link is used


@pytest.mark.django_db
def test_the_invited_contact_sets_a_password_becomes_team_admin_and_lands_on_the_jobs_list(
    operator_client, application
):
    path = _accept(operator_client, application)
    contact = Client()
    page = contact.get(path, follow=True)
    assert page.status_code == 200 and application.email in page.content.decode()
    response = _set_password(contact, path)
    assert response.status_code == 302 and response["Location"] == reverse("jobs:list")
    assert contact.get(reverse("jobs:list")).status_code == 200  # logged in by the link
    user = get_user_model().objects.get(username=application.email)
    membership = Membership.objects.get(user=user)
    assert (membership.team.name, membership.role) == (application.team_name, "admin")
    assert Client().login(username=application.email, password=PASSWORD)  # and can sign in again later


@pytest.mark.django_db
def test_an_invitation_link_used_twice_is_refused(operator_client, application):
    path = _accept(operator_client, application)
    assert _set_password(Client(), path).status_code == 302
    second = Client()
    assert second.get(path).status_code == 410
    response = _set_password(second, path, password="another long passphrase 99")
    assert response.status_code == 410
    assert "_auth_user_id" not in second.session
    assert get_user_model().objects.filter(email=application.email).count() == 1


@pytest.mark.django_db
def test_an_expired_invitation_link_is_refused(operator_client, application):
    path = _accept(operator_client, application)
    with time_machine.travel(timezone.now() + timedelta(days=7, seconds=1)):
        contact = Client()
        assert contact.get(path).status_code == 410
        assert _set_password(contact, path).status_code == 410
    assert not get_user_model().objects.filter(email=application.email).exists()


@pytest.mark.django_db
def test_an_expired_invitation_is_sent_again_and_only_the_new_link_works(
    operator_client, application, settings
):
    settings.E31_INVITATION_TTL_S = 60
    old = _accept(operator_client, application)
    later = timezone.now() + timedelta(minutes=2)
    with time_machine.travel(later):
        page = operator_client.get(reverse("partners-application", args=[application.id])).content.decode()
        assert "it expired" in page and "Send a new link" in page
        sent = operator_client.post(reverse("partners-reinvite", args=[application.id]), follow=True)
        assert "A new invitation link was sent to" in sent.content.decode()
        new = LINK.search(mail.outbox[-1].body).group(1)
        assert new != old and mail.outbox[-1].to == [application.email]
        assert Client().get(old).status_code == 410
        contact = Client()
        assert _set_password(contact, new).status_code == 302
    assert Membership.objects.filter(user__email=application.email, role="admin").count() == 1
    again = operator_client.post(reverse("partners-reinvite", args=[application.id]), follow=True)
    assert "has no unused invitation" in again.content.decode()  # used: nothing to send
    # The new link makes its holder the team's admin: who sent it is in the audit log, once.
    [reissued] = AuditEntry.objects.filter(action="team.invitation-reissue")
    assert (reissued.actor, reissued.target) == ("olga", f"team:{Team.objects.get().slug}")
    assert reissued.before["expires_at"] < reissued.after["expires_at"]


@pytest.mark.django_db
def test_only_operators_send_an_invitation_again(member_client, client, operator_client, application):
    _accept(operator_client, application)
    url = reverse("partners-reinvite", args=[application.id])
    sent = len(mail.outbox)
    assert member_client.post(url).status_code == 404
    assert client.post(url).status_code == 302  # to the sign-in page
    assert len(mail.outbox) == sent


@pytest.mark.django_db
def test_an_altered_invitation_link_is_refused(operator_client, application):
    path = _accept(operator_client, application)
    token = path.split("/")[2]
    altered = reverse("invite", args=[token[:-1] + ("A" if token[-1] != "A" else "B")])
    contact = Client()
    assert contact.get(altered).status_code == 410
    assert _set_password(contact, altered).status_code == 410
    assert contact.get(reverse("invite", args=["x" * 500])).status_code == 410
    assert Invitation.objects.get().used_at is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    "password, again, message",
    [
        ("short", "short", "too short"),
        (PASSWORD, PASSWORD + "x", "the two passwords differ"),
        ("password123", "password123", "too common"),
    ],
)
def test_a_weak_or_mismatched_password_is_refused_and_the_link_still_works(
    operator_client, application, password, again, message
):
    path = _accept(operator_client, application)
    response = _set_password(Client(), path, password=password, again=again)
    assert response.status_code == 422 and message in response.content.decode()
    assert Invitation.objects.get().used_at is None
    assert _set_password(Client(), path).status_code == 302


@pytest.mark.django_db
def test_an_existing_account_with_the_contacts_email_is_never_handed_over(operator_client, application):
    path = _accept(operator_client, application)
    contact = Client()
    form = contact.get(path, follow=True)  # the contact has the form open...
    # ...when an account is made of the address (accepting refuses an address that already has one).
    get_user_model().objects.create_user(username=application.email, password="original password 42")
    page = Client().get(path, follow=True)  # said before the password is asked for
    assert page.status_code == 410 and "ask an operator" in page.content.decode()
    filled = {"password1": PASSWORD, "password2": PASSWORD, **_form_key(form)}
    response = contact.post(reverse("invite", args=["set-password"]), filled)
    assert response.status_code == 410 and "ask an operator" in response.content.decode()
    assert Client().login(username=application.email, password="original password 42")
    assert Invitation.objects.get().used_at is None


def test_an_account_made_of_the_address_a_moment_ago_is_refused_cleanly_not_with_a_server_error(
    operator_client, application, monkeypatch
):
    """Another link for the address (a team admin's) made its account after this redemption found it free."""
    _accept(operator_client, application)
    digest = Invitation.objects.get().digest
    get_user_model().objects.create_user(username=application.email, password="original password 42")
    # Read before that account committed:
    monkeypatch.setattr(accounts_selectors, "address_taken", lambda email: False)
    with pytest.raises(services.InvitationRefused, match="ask an operator"):
        services.redeem_invitation(digest=digest, password=PASSWORD, now=timezone.now())
    assert Client().login(username=application.email, password="original password 42")
    assert Invitation.objects.get().used_at is None


def test_a_link_sent_again_between_its_check_and_its_claim_no_longer_works(
    operator_client, application, monkeypatch
):
    """Sending a new link renews the row: the claim matches the old token's digest, not only the row."""
    _accept(operator_client, application)
    old = Invitation.objects.get().digest
    read = selectors.usable_invitation

    def read_then_sent_again(**kwargs):
        found = read(**kwargs)
        services.reissue_invitation(application_id=application.id, by="olga", now=timezone.now())
        return found

    monkeypatch.setattr(selectors, "usable_invitation", read_then_sent_again)
    with pytest.raises(services.InvitationRefused):
        services.redeem_invitation(digest=old, password=PASSWORD, now=timezone.now())
    assert not get_user_model().objects.filter(username=application.email).exists()


@pytest.mark.django_db
def test_a_partners_form_filled_in_after_a_team_link_was_opened_in_the_same_browser_is_refused(
    operator_client, application, team, team_admin
):
    """The browser's session holds the link it opened last; a form says which invitation it was shown for."""
    path = _accept(operator_client, application)
    invited = members.invite_member(
        team=team, email="carol@example.com", actor=team_admin, now=timezone.now()
    )
    contact = Client()
    form = contact.get(path, follow=True)
    assert "the admin of team" in form.content.decode()
    contact.get(reverse("invite", args=[invited.token]))  # another tab
    filled = {"password1": PASSWORD, "password2": PASSWORD, **_form_key(form)}
    response = contact.post(reverse("invite", args=["set-password"]), filled)
    assert response.status_code == 409 and "This page is out of date" in response.content.decode()
    assert not get_user_model().objects.filter(username__in=[application.email, "carol@example.com"]).exists()
    assert _set_password(contact, path).status_code == 302  # the partner's link, opened again
    assert Membership.objects.get(user__username=application.email).role == "admin"


def test_a_live_link_is_never_written_to_a_log_when_the_form_is_refused(operator_client, application, caplog):
    """Django (django.request) and the denial log write the path of every 4xx; the token must not be in it."""
    caplog.set_level(logging.INFO)
    path = _accept(operator_client, application)
    token = path.split("/")[2]
    assert _set_password(Client(), path, again=PASSWORD + "x").status_code == 422
    assert _set_password(Client(enforce_csrf_checks=True), path).status_code == 403
    assert Invitation.objects.get().used_at is None
    assert [r.name for r in caplog.records if token in r.getMessage()] == []
    assert any("/invite/set-password/" in r.getMessage() for r in caplog.records)  # the refusals were logged


@pytest.mark.django_db
def test_the_invitation_form_needs_csrf(operator_client, application):
    path = _accept(operator_client, application)
    assert _set_password(Client(enforce_csrf_checks=True), path).status_code == 403


@pytest.mark.django_db
def test_declining_keeps_the_note_and_tells_the_applicant(operator_client, application):
    url = reverse("partners-decline", args=[application.id])
    response = operator_client.post(url, {"note": "Your data cannot be moved yet."})
    assert response.status_code == 302
    application.refresh_from_db()
    assert (application.status, application.decision_note) == ("declined", "Your data cannot be moved yet.")
    assert mail.outbox[-1].to == [application.email]
    assert "Your data cannot be moved yet." in mail.outbox[-1].body
    assert not Team.objects.filter(name=application.team_name).exists()
    [declined] = AuditEntry.objects.filter(action="partner.decline")
    assert (declined.actor, declined.target) == ("olga", f"application:{application.id}")
    assert declined.after == {"status": "declined", "note": "Your data cannot be moved yet."}


@pytest.mark.django_db
def test_a_decline_needs_a_note(operator_client, application):
    response = operator_client.post(reverse("partners-decline", args=[application.id]), {"note": ""})
    assert response.status_code == 422
    application.refresh_from_db()
    assert application.status == "pending"


@pytest.mark.django_db
def test_an_application_is_decided_only_once(operator_client, application):
    operator_client.post(reverse("partners-decline", args=[application.id]), {"note": "no"})
    operator_client.post(
        reverse("partners-accept", args=[application.id]), {"team_name": application.team_name}
    )
    application.refresh_from_db()
    assert application.status == "declined"
    assert not Invitation.objects.exists() and not Team.objects.filter(name=application.team_name).exists()
    with pytest.raises(services.IntakeError):
        services.decline_application(
            application_id=application.id, note="again", by="olga", now=timezone.now()
        )


@pytest.mark.django_db
def test_accepting_under_a_team_name_already_taken_is_refused_with_422(operator_client, application, team):
    response = operator_client.post(
        reverse("partners-accept", args=[application.id]), {"team_name": "Vision"}
    )
    assert response.status_code == 422
    assert "a team with this name already exists" in response.content.decode()
    application.refresh_from_db()
    assert application.status == "pending" and not mail.outbox


@pytest.mark.django_db
def test_the_accept_form_needs_csrf(operator, application):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    assert (
        client.post(reverse("partners-accept", args=[application.id]), {"team_name": "x"}).status_code == 403
    )


@pytest.mark.django_db
def test_accepting_an_application_from_an_address_with_an_account_is_refused_and_creates_no_team(
    operator_client, client, intake_open
):
    """Eve's first application was accepted and she set her password; her second (same address) cannot be:
    its invitation would be refused at redemption and leave a team nobody can join."""
    first = ApplicationFactory(email="eve@example.com")
    _set_password(client, _accept(operator_client, first, team_name="Footage Lab"))
    second = ApplicationFactory(email="eve@example.com")
    teams_before = Team.objects.count()
    mail.outbox.clear()
    url = reverse("partners-accept", args=[second.id])
    response = operator_client.post(url, {"team_name": "Footage Lab West"}, follow=True)
    second.refresh_from_db()
    assert second.status == Application.Status.PENDING
    assert Team.objects.count() == teams_before and not mail.outbox
    assert "eve@example.com already has an account: nothing was accepted" in response.content.decode()


@pytest.mark.django_db
def test_an_invited_contact_signs_in_with_the_address_as_they_typed_it(operator_client, application):
    """The invitation says "You will sign in as eve@example.com" (lowercased at intake); Eve types it as she
    wrote it in her application."""
    application.email = "eve@example.com"
    application.save()
    _set_password(Client(), _accept(operator_client, application))
    response = Client().post(reverse("accounts:login"), {"username": "Eve@Example.com", "password": PASSWORD})
    assert response.status_code == 302 and response["Location"] == "/jobs/"


LURE = "Bob. Your E31 account is suspended: verify at https://e31-verify.example/login now"


@pytest.mark.django_db
def test_a_decline_repeats_nothing_the_applicant_typed_to_an_address_nobody_proved(
    client, operator_client, operator
):
    """The form's address is never verified: whatever the applicant typed as names would reach anyone, in E31's
    own e-mail, once an operator declined the obvious spam. Only the operator's note is repeated."""
    services.set_intake_open(is_open=True, by=operator.username, now=timezone.now())
    posted = client.post(
        reverse("partners"),
        application_post(contact_name=LURE[:120], team_name="IT Security Desk", email="victim@example.org"),
    )
    assert posted.status_code == 302, posted.content[:500]
    application = Application.objects.get(email="victim@example.org")
    mail.outbox.clear()
    operator_client.post(
        reverse("partners-decline", args=[application.id]), {"note": "Not a fit for the preview."}
    )
    (message,) = mail.outbox
    assert message.to == ["victim@example.org"]
    assert "Not a fit for the preview." in message.body
    assert "e31-verify.example" not in message.body and "IT Security Desk" not in message.body


@pytest.mark.django_db
def test_an_invitation_names_the_team_the_operator_created_not_what_the_applicant_typed(operator_client):
    application = ApplicationFactory(contact_name=LURE[:120], team_name="IT Security Desk")
    operator_client.post(reverse("partners-accept", args=[application.id]), {"team_name": "Footage Lab"})
    body = mail.outbox[-1].body
    assert '"Footage Lab"' in body
    assert "e31-verify.example" not in body and "IT Security Desk" not in body


@pytest.mark.django_db
def test_invitation_links_start_with_the_consoles_address_not_the_requests_host(
    operator_client, application, settings
):
    """Behind a proxy the request may come in as plain HTTP on an internal host name: the single-use link that
    creates an account must not go out as http://10.0.0.5/invite/..."""
    settings.E31_CONSOLE_URL = "https://console.e31.example"
    settings.ALLOWED_HOSTS = ["console.e31.example", "10.0.0.5"]
    operator_client.post(
        reverse("partners-accept", args=[application.id]),
        {"team_name": application.team_name},
        HTTP_HOST="10.0.0.5",
    )
    assert "https://console.e31.example/invite/" in mail.outbox[-1].body
    mail.outbox.clear()
    Invitation.objects.update(expires_at=timezone.now() - timedelta(minutes=1))
    operator_client.post(reverse("partners-reinvite", args=[application.id]), HTTP_HOST="10.0.0.5")
    assert "https://console.e31.example/invite/" in mail.outbox[-1].body


@pytest.mark.django_db
def test_an_accepted_team_and_its_contact_joining_as_admin_are_in_the_audit_log(
    operator_client, operator, application
):
    """Reproduction: accepting an application created a team, and redeeming its link made the contact its admin, with
    no audit entry for either, where every other join is in the operators' audit log."""
    from operations.models import AuditEntry

    _set_password(Client(), _accept(operator_client, application))
    team = Team.objects.get(name=application.team_name)
    entries = list(AuditEntry.objects.order_by("id").values_list("action", "actor", "target", "after"))
    assert entries == [
        ("team.create", operator.username, f"team:{team.slug}", {"name": team.name, "application": application.id}),
        ("team.member-join", application.email, f"team:{team.slug}",
         {"member": application.email, "role": "admin", "accepted_by": operator.username}),
    ]  # fmt: skip
