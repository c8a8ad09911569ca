"""Team members: any member reads the list, a team admin invites by e-mail, changes roles and removes; the
team never loses its last admin, and another team's page does not exist for a non-member."""

import functools
import logging
import re
import threading
from datetime import timedelta
from smtplib import SMTPException

import pytest
import time_machine
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.core import mail
from django.core.cache import cache
from django.core.signals import got_request_exception
from django.db import IntegrityError, connection, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.views.debug import SafeExceptionReporterFilter

from accounts import emails, members, selectors, services
from accounts.models import Membership, TeamInvitation
from operations.models import AuditEntry
from public import services as public_services
from tests.factories import JobFactory, MembershipFactory, UserFactory
from tests.pages.factories import ApplicationFactory

pytestmark = pytest.mark.django_db
PASSWORD = "a long and unusual passphrase 31"
LINK = re.compile(re.escape(settings.E31_CONSOLE_URL) + r"(/invite/[^/\s]+/)")
FORM_KEY = re.compile(r'name="invitation" value="([^"]*)"')
MEMBERS = reverse("accounts:members", args=["vision"])
JOIN = reverse("invite", args=["set-password"])  # where an opened link leads


@pytest.fixture(autouse=True)
def _fresh_rate_limits(db):
    """Rate-limit counters live in the cache: the database's table (rolled back with the test) or Redis (not)."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def admin_client(team_admin) -> Client:
    client = Client()
    client.force_login(team_admin)
    return client


def invite(client: Client, email: str, slug: str = "vision"):
    return client.post(reverse("accounts:members", args=[slug]), {"email": email})


def invitation_path() -> str:
    return LINK.search(mail.outbox[-1].body).group(1)


def set_password(client: Client, path: str, again: str = PASSWORD):
    """Opens the link as its e-mail does (it moves into the session) and posts the form it leads to, with the
    field that says which invitation the form is for."""
    opened = client.get(path)
    form = opened["Location"] if opened.status_code == 302 else path
    return client.post(form, {"password1": PASSWORD, "password2": again, **form_key(client.get(form))})


def form_key(page) -> dict[str, str]:
    found = FORM_KEY.search(page.content.decode())
    return {"invitation": found.group(1)} if found else {}


def roles(team) -> dict[str, str]:
    return dict(Membership.objects.filter(team=team).values_list("user__username", "role"))


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def join(client: Client, path: str = ""):
    """Opens the link (when given: it moves into the session) and presses Join, as the page it leads to offers,
    or as a forged form would where the page offers no button."""
    if path:
        client.get(path)
    key = form_key(client.get(JOIN)) or {
        "invitation": f"teaminvitation-{TeamInvitation.objects.latest('id').id}"
    }
    return client.post(JOIN, {"join": "1", **key})


def fail_mail(*args, **kwargs):
    raise SMTPException("mail relay down")


# --- Reading ----------------------------------------------------------------------------------------


def test_any_member_sees_every_member_with_address_role_and_joining_date(member_client, member, team_admin):
    team_admin.email = "adele@example.com"
    team_admin.save()
    response = member_client.get(MEMBERS)
    html = response.content.decode()
    assert response.status_code == 200
    assert [m.user.username for m in response.context["rows"]] == ["adele", "alice"]
    assert "adele@example.com" in html and "Team admin" in html and "Member" in html
    assert timezone.now().strftime("%Y-%m-%d") in html
    assert 'id="invite-form"' not in html and "Pending invitations" not in html  # an admin's tools only


def test_another_teams_page_is_404_to_a_non_member_like_a_team_that_does_not_exist(
    outsider_client, team, member
):
    assert outsider_client.get(MEMBERS).status_code == 404
    assert outsider_client.get(reverse("accounts:members", args=["no-such-team"])).status_code == 404
    assert invite(outsider_client, "x@example.com").status_code == 404
    remove = reverse("accounts:member-remove", args=["vision", member.id])
    assert outsider_client.post(remove).status_code == 404
    assert Client().get(MEMBERS).status_code == 302  # signed out: to the sign-in page
    assert Membership.objects.filter(team=team).count() == 1 and not mail.outbox


def test_the_menus_members_opens_the_users_first_team(member_client, outsider_client):
    assert member_client.get(reverse("accounts:members-home"))["Location"] == MEMBERS
    html = member_client.get(MEMBERS).content.decode()
    assert f'href="{reverse("accounts:members-home")}" aria-current="page"' in html


# --- Who may change what ----------------------------------------------------------------------------


def test_a_member_who_is_not_an_admin_cannot_invite_change_a_role_remove_or_cancel(
    member_client, member, team, team_admin
):
    pending = _pending_invitation(team, team_admin)
    assert invite(member_client, "carol@example.com").status_code == 403
    role = reverse("accounts:member-role", args=["vision", team_admin.id])
    assert member_client.post(role, {"role": "member"}).status_code == 403
    assert (
        member_client.post(
            reverse("accounts:member-role", args=["vision", member.id]), {"role": "admin"}
        ).status_code
        == 403
    )
    assert (
        member_client.post(reverse("accounts:member-remove", args=["vision", team_admin.id])).status_code
        == 403
    )
    cancel = reverse("accounts:invitation-cancel", args=["vision", pending.id])
    assert member_client.post(cancel).status_code == 403
    assert roles(team) == {"alice": "member", "adele": "admin"}
    assert list(TeamInvitation.objects.all()) == [pending] and not mail.outbox


def test_an_admin_demoted_a_moment_ago_changes_nothing_more(team, team_admin, member):
    other = MembershipFactory(team=team, user=UserFactory(username="abe"), role="admin").user
    members.change_role(team=team, user_id=team_admin.id, role="member", actor=other, now=timezone.now())
    with pytest.raises(members.NotTeamAdmin):
        members.remove_member(team=team, user_id=member.id, actor=team_admin, now=timezone.now())


# --- Inviting -----------------------------------------------------------------------------------------


def test_inviting_an_address_sends_a_single_use_link_and_keeps_only_its_digest(admin_client, team):
    response = invite(admin_client, "  Carol@Example.com ")
    assert response.status_code == 302
    assert [m.to for m in mail.outbox] == [["carol@example.com"]]
    assert "adele invites you to team" in mail.outbox[0].subject
    token = invitation_path().split("/")[2]
    invitation = TeamInvitation.objects.get()
    assert (invitation.team, invitation.email, invitation.invited_by.username) == (
        team,
        "carol@example.com",
        "adele",
    )
    assert invitation.digest == services.digest_token(token) and token not in invitation.digest
    assert timedelta(days=6) < invitation.expires_at - timezone.now() <= timedelta(days=7)
    page = admin_client.get(MEMBERS).content.decode()
    assert "carol@example.com" in page and invitation.expires_at.strftime("%Y-%m-%d %H:%M") in page
    assert not get_user_model().objects.filter(username="carol@example.com").exists()


def test_the_invited_person_sets_a_password_and_is_signed_in_as_a_member_of_the_team(admin_client, team):
    invite(admin_client, "carol@example.com")
    path, carol = invitation_path(), Client()
    page = carol.get(path, follow=True).content.decode()
    assert "carol@example.com" in page and "a member of team" in page
    response = set_password(carol, path)
    assert response.status_code == 302 and response["Location"] == reverse("jobs:list")
    assert carol.get(reverse("jobs:list")).status_code == 200  # signed in by the link
    assert roles(team)["carol@example.com"] == "member"
    assert carol.get(MEMBERS).status_code == 200
    assert Client().login(username="Carol@Example.com", password=PASSWORD)
    assert not TeamInvitation.objects.filter(used_at__isnull=True).exists()


def test_six_colleagues_behind_one_office_address_all_join(admin_client, team, settings):
    """Posts to the link's page counted per client address: an admin inviting six colleagues of one office (one
    address behind its NAT) saw the sixth refused 429 for ten minutes. Each link now has its own count."""
    settings.E31_PUBLIC_FORM_LIMIT = 5
    answers = []
    for n in range(6):
        invite(admin_client, f"colleague{n}@example.com")
        answers.append(set_password(Client(REMOTE_ADDR="203.0.113.7"), invitation_path()).status_code)
    assert answers == [302] * 6
    assert sum(role == "member" for role in roles(team).values()) == 6


def test_one_links_posts_are_still_limited(admin_client, settings):
    settings.E31_PUBLIC_FORM_LIMIT = 2
    invite(admin_client, "carol@example.com")
    carol, path = Client(), invitation_path()
    answers = [set_password(carol, path, again="not the same").status_code for _ in range(3)]
    assert answers == [422, 422, 429]


def test_the_password_set_on_the_link_page_is_kept_out_of_error_reports(admin_client, monkeypatch):
    """Django's error reports (the debug page, the e-mail to the admins, any reporter) show a view's POST unless
    the view names its secret fields; sign-in's did, this page's did not."""
    reports = []

    def broken(*args, **kwargs):
        raise RuntimeError("redeeming failed")

    def report(sender, request, **kwargs):
        reports.append(SafeExceptionReporterFilter().get_post_parameters(request))

    invite(admin_client, "carol@example.com")
    monkeypatch.setattr(public_services, "redeem_invitation", broken)
    got_request_exception.connect(report)
    try:
        carol = Client(raise_request_exception=False)
        assert set_password(carol, invitation_path()).status_code == 500
    finally:
        got_request_exception.disconnect(report)
    assert reports and reports[0]["password1"] != PASSWORD and reports[0]["password2"] != PASSWORD


def test_inviting_again_renews_the_link_and_the_old_one_stops_working(admin_client, team):
    invite(admin_client, "carol@example.com")
    first = invitation_path()
    invite(admin_client, "carol@example.com")
    second = invitation_path()
    assert first != second and TeamInvitation.objects.count() == 1
    assert Client().get(first).status_code == 410
    assert set_password(Client(), second).status_code == 302


def test_a_cancelled_invitation_leaves_the_list_and_its_link_is_refused(admin_client, team):
    invite(admin_client, "carol@example.com")
    path, invitation = invitation_path(), TeamInvitation.objects.get()
    response = admin_client.post(reverse("accounts:invitation-cancel", args=["vision", invitation.id]))
    assert response.status_code == 302 and not TeamInvitation.objects.exists()
    assert set_password(Client(), path).status_code == 410
    assert "carol@example.com" not in roles(team)


def test_an_invitation_link_used_twice_is_refused(admin_client, team):
    invite(admin_client, "carol@example.com")
    path = invitation_path()
    assert set_password(Client(), path).status_code == 302
    second = Client()
    assert second.get(path).status_code == 410 and set_password(second, path).status_code == 410
    assert "_auth_user_id" not in second.session
    assert get_user_model().objects.filter(email="carol@example.com").count() == 1


def test_an_expired_invitation_link_is_refused_and_listed_as_expired(admin_client, team, settings):
    settings.E31_INVITATION_TTL_S = 60  # the partners' setting: both links last as long
    invite(admin_client, "carol@example.com")
    path = invitation_path()
    with time_machine.travel(timezone.now() + timedelta(seconds=61)):
        assert Client().get(path).status_code == 410
        assert set_password(Client(), path).status_code == 410
        assert "expired" in admin_client.get(MEMBERS).content.decode()
    assert not get_user_model().objects.filter(username="carol@example.com").exists()


def test_a_link_whose_address_got_an_account_meanwhile_makes_no_second_account(admin_client, team):
    """The password is not set on that account, nor a second account made: the page now asks to sign in as it."""
    invite(admin_client, "carol@example.com")
    browser = Client()
    form = browser.get(invitation_path(), follow=True)  # carol has the form open...
    UserFactory(username="carol", email="carol@example.com")  # ...when an account takes the address
    filled = {"password1": PASSWORD, "password2": PASSWORD, **form_key(form)}
    response = browser.post(JOIN, filled)
    assert response.status_code == 409 and "Sign in to join team vision" in response.content.decode()
    assert TeamInvitation.objects.get().used_at is None and "carol" not in roles(team)
    assert get_user_model().objects.filter(email="carol@example.com").count() == 1
    assert not Client().login(username="carol@example.com", password=PASSWORD)


def test_an_admins_invitations_are_rate_limited(admin_client, settings):
    settings.E31_TEAM_INVITE_LIMIT = 2
    assert invite(admin_client, "a@example.com").status_code == 302
    assert invite(admin_client, "b@example.com").status_code == 302
    refused = invite(admin_client, "c@example.com")
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert len(mail.outbox) == 2 and not TeamInvitation.objects.filter(email="c@example.com").exists()


def test_an_invalid_address_is_refused_with_its_reason(admin_client):
    response = invite(admin_client, "not an address")
    assert response.status_code == 422 and 'aria-invalid="true"' in response.content.decode()
    assert not TeamInvitation.objects.exists() and not mail.outbox


def test_the_database_keeps_one_open_invitation_per_team_and_address(team, team_admin):
    _pending_invitation(team, team_admin)
    with pytest.raises(IntegrityError), transaction.atomic():
        _pending_invitation(team, team_admin, digest="b" * 64)


def test_an_address_that_grows_as_it_is_stored_is_refused_as_too_long(admin_client):
    """A domain outside ASCII is stored in its ASCII (IDNA) form: 95 characters as typed, 158 as stored."""
    email = "a@" + ".".join(["\u00e9t\u00e9" * 3] * 9) + ".com"
    response = invite(admin_client, email)
    assert response.status_code == 422 and "at most 150 characters" in response.content.decode()
    assert not TeamInvitation.objects.exists() and not mail.outbox


def test_an_address_two_accounts_share_is_refused_and_sent_no_link(admin_client, team):
    """It names neither account (sign-in will not guess between them), and a link for it would be refused."""
    UserFactory(username="c1", email="shared@example.com")
    UserFactory(username="c2", email="Shared@example.com")
    response = invite(admin_client, "shared@example.com")
    assert response.status_code == 409 and "more than one account" in response.content.decode()
    assert not TeamInvitation.objects.exists() and not mail.outbox
    assert roles(team) == {"adele": "admin"}


# --- The invitation link ------------------------------------------------------------------------------


def test_opening_the_link_moves_its_token_from_the_address_into_the_session(admin_client):
    invite(admin_client, "carol@example.com")
    path = invitation_path()
    opened = Client().get(path)
    assert opened.status_code == 302 and opened["Location"] == reverse("invite", args=["set-password"])
    refused = Client().get(opened["Location"])  # another browser: the link was not opened there
    assert refused.status_code == 410 and "open the link in your e-mail again" in refused.content.decode()


def test_a_live_token_is_never_written_to_a_log_whatever_the_form_answers(admin_client, caplog, settings):
    """Django (django.request) and the denial log write the path of every 4xx: a mistyped confirmation (422),
    a stale CSRF cookie (403), too many tries (429). The token must not be in that path."""
    settings.E31_PUBLIC_FORM_LIMIT = 1
    caplog.set_level(logging.INFO)
    invite(admin_client, "carol@example.com")
    path = invitation_path()
    token = path.split("/")[2]
    assert set_password(Client(), path, again="something else entirely").status_code == 422
    assert set_password(Client(enforce_csrf_checks=True), path).status_code == 403
    assert set_password(Client(), path).status_code == 429
    assert TeamInvitation.objects.get().used_at is None  # the link still works
    assert [r.name for r in caplog.records if token in r.getMessage()] == []
    assert any("/invite/set-password/" in r.getMessage() for r in caplog.records)  # the refusals were logged


def test_a_link_whose_address_got_an_account_says_so_before_asking_for_a_password(admin_client, team):
    invite(admin_client, "carol@example.com")
    path = invitation_path()
    UserFactory(username="carol", email="carol@example.com")
    page = Client().get(path, follow=True)
    html = page.content.decode()
    assert page.status_code == 200 and "for an existing account" in html and "Set your password" not in html


def test_opening_a_link_stores_no_live_token_in_the_database(admin_client):
    """Sessions are rows of django_session, their contents readable: a live token there would let a database
    reader or a backup redeem the link. The session keeps the digest the invitation's row keeps."""
    invite(admin_client, "cat@example.com")
    path = invitation_path()
    token = path.split("/")[2]
    assert Client().get(path).status_code == 302
    stored = [str(s.get_decoded()) for s in Session.objects.all()]
    assert not [data for data in stored if token in data]
    assert [data for data in stored if TeamInvitation.objects.get().digest in data]


def test_a_form_shown_for_one_invitation_never_redeems_another_opened_later_in_the_same_browser(admin_client):
    """The session holds the link a browser opened last: ann's page, filled in after ben's link was opened in
    another tab, must neither make ben's account with ann's password nor sign the browser in as ben."""
    invite(admin_client, "ann@example.com")
    ann = invitation_path()
    invite(admin_client, "ben@example.com")
    ben = invitation_path()
    browser = Client()
    first_tab = browser.get(browser.get(ann)["Location"])
    assert "ann@example.com" in first_tab.content.decode()
    browser.get(ben)  # the second tab
    form = reverse("invite", args=["set-password"])
    filled = {"password1": PASSWORD, "password2": PASSWORD}
    stale = browser.post(form, {**filled, **form_key(first_tab)})
    assert stale.status_code == 409 and "open the link in its e-mail again" in stale.content.decode()
    assert browser.post(form, filled).status_code == 409  # a form that says no invitation at all
    assert not get_user_model().objects.filter(username__in=["ann@example.com", "ben@example.com"]).exists()
    assert "_auth_user_id" not in browser.session
    assert not TeamInvitation.objects.filter(used_at__isnull=False).exists()
    assert set_password(browser, ann).status_code == 302  # opened again: ann's page, and ann's account
    assert Client().login(username="ann@example.com", password=PASSWORD)
    assert not get_user_model().objects.filter(username="ben@example.com").exists()


def test_a_link_from_an_admin_deactivated_or_deleted_since_is_refused_with_the_reason(
    team, team_admin, operator
):
    """Demoting or removing an admin cancels their links; deactivating them does not touch the team, so the
    link is checked when used: whoever sent it must still be an admin of the team who can sign in."""
    rex, roy = (
        MembershipFactory(team=team, user=UserFactory(username=n), role="admin").user for n in ("rex", "roy")
    )
    now = timezone.now()
    sent = {
        email: members.invite_member(team=team, email=email, actor=by, now=now).token
        for by, email in (
            (rex, "mallory@example.com"),
            (roy, "trent@example.com"),
            (operator, "carol@example.com"),
        )
    }
    rex.is_active = False
    rex.save()
    roy.delete()
    for email in ("mallory@example.com", "trent@example.com"):
        page = Client().get(reverse("invite", args=[sent[email]]), follow=True)
        html = page.content.decode()
        assert page.status_code == 410 and "no longer an admin of the team" in html
        assert "Set your password" not in html  # said before a password is asked for
        with pytest.raises(members.InvitationRefused, match="ask one of its admins for a new link"):
            members.redeem_team_invitation(
                digest=selectors.link_digest(sent[email]), password=PASSWORD, now=timezone.now()
            )
    assert TeamInvitation.objects.filter(used_at__isnull=True).count() == 3  # none spent
    assert set_password(Client(), reverse("invite", args=[sent["carol@example.com"]])).status_code == 302
    assert roles(team) == {"adele": "admin", "rex": "admin", "carol@example.com": "member"}


def test_a_link_renewed_between_its_check_and_its_claim_no_longer_works(team, team_admin, monkeypatch):
    """Inviting again renews the row: the claim matches the old token's digest, not only the row."""
    old = members.invite_member(team=team, email="carol@example.com", actor=team_admin, now=timezone.now())
    read = selectors.usable_team_invitation

    def read_then_renewed(**kwargs):
        found = read(**kwargs)
        members.invite_member(team=team, email="carol@example.com", actor=team_admin, now=timezone.now())
        return found

    monkeypatch.setattr(selectors, "usable_team_invitation", read_then_renewed)
    with pytest.raises(members.InvitationRefused):
        members.redeem_team_invitation(
            digest=selectors.link_digest(old.token), password=PASSWORD, now=timezone.now()
        )
    assert not get_user_model().objects.filter(username="carol@example.com").exists()


def at_once(*calls) -> list[str]:
    """Runs each call in a thread and transaction of its own, all at once; what each came to: "joined",
    "refused", or the name of the error that escaped (the database error a race test guards against)."""
    outcomes = []

    def run(call):
        try:
            with transaction.atomic():
                call()
            outcomes.append("joined")
        except members.InvitationRefused:
            outcomes.append("refused")
        except Exception as exc:
            outcomes.append(type(exc).__name__)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


@pytest.mark.django_db(transaction=True)
def test_two_teams_links_for_one_address_redeemed_at_once_refuse_one_cleanly(
    team, other_team, operator, monkeypatch
):
    """Two teams invited the same new person, who opens both e-mails at once: one joins, the other is refused
    (a 410 page), never a database error (a 500)."""
    now = timezone.now()
    digests = [
        selectors.link_digest(
            members.invite_member(team=t, email="carol@example.com", actor=operator, now=now).token
        )
        for t in (team, other_team)
    ]
    barrier, real = threading.Barrier(2), selectors.address_taken

    def taken_then_wait(email):
        result = real(email)
        barrier.wait(timeout=5)  # both have found the address free before either makes the account
        return result

    monkeypatch.setattr(selectors, "address_taken", taken_then_wait)
    outcomes = at_once(
        *(
            functools.partial(members.redeem_team_invitation, digest=d, password=PASSWORD, now=timezone.now())
            for d in digests
        )
    )
    assert sorted(outcomes) == ["joined", "refused"]
    assert get_user_model().objects.filter(username="carol@example.com").count() == 1
    assert TeamInvitation.objects.filter(used_at__isnull=True).count() == 1  # the refused link was not spent


# --- An address that has an account: it joins once that account, signed in, confirms ------------------


def test_a_squatted_address_never_lets_its_squatter_into_another_team_that_invites_it(
    admin_client, team, other_team, monkeypatch
):
    """Team audio's admin invites an address nobody has an account for, the mail fails and the page shows the
    link: they use it themselves and own an account under that address. Team vision inviting the address later
    must not hand them vision: its link goes to the address, and only someone signed in as that account who
    holds the link can take it."""
    mallory = MembershipFactory(team=other_team, user=UserFactory(username="mallory"), role="admin").user
    rogue = signed_in(mallory)
    monkeypatch.setattr(emails, "send_mail", fail_mail)
    assert invite(rogue, "carol@audio.example", slug="audio").status_code == 302
    shown = rogue.get(reverse("accounts:members", args=["audio"])).content.decode()
    squatted_link = LINK.search(shown).group(1)  # "Send this link yourself"
    assert set_password(Client(), squatted_link).status_code == 302  # mallory now owns carol@audio.example
    monkeypatch.undo()

    assert invite(admin_client, "carol@audio.example").status_code == 302
    assert "carol@audio.example" not in roles(team)
    assert [m.to for m in mail.outbox] == [["carol@audio.example"]]  # the link went to the address alone
    vision_link = invitation_path()
    refused = rogue.get(vision_link, follow=True)  # were the link to reach mallory, signed in as mallory
    assert refused.status_code == 403 and "Join team" not in refused.content.decode()
    assert join(rogue).status_code == 403
    anonymous = Client()
    offered = anonymous.get(vision_link, follow=True).content.decode()
    assert "Sign in" in offered and "Set your password" not in offered
    assert set_password(anonymous, vision_link).status_code == 409  # no password is set on that account
    assert roles(team) == {"adele": "admin"}
    assert TeamInvitation.objects.get(team=team).used_at is None


def test_an_address_with_an_account_joins_only_once_that_account_signed_in_confirms(
    admin_client, team, other_team, outsider
):
    outsider.email = "Bob@Example.com"
    outsider.save()
    assert invite(admin_client, "bob@example.com").status_code == 302
    assert "bob" not in roles(team)
    invitation = TeamInvitation.objects.get()
    assert (invitation.email, invitation.used_at) == ("bob@example.com", None)
    assert [m.to for m in mail.outbox] == [["bob@example.com"]]
    assert "adele invites you to team vision" in mail.outbox[0].subject
    page = admin_client.get(MEMBERS).content.decode()
    assert "Invitation sent to bob@example.com" in page and "had an account" not in page
    assert "audio" not in page  # nothing about the account's other teams

    bob, path = signed_in(outsider), invitation_path()
    shown = bob.get(path, follow=True)
    html = shown.content.decode()
    assert shown.status_code == 200 and "Join team" in html and "vision" in html
    assert "Set your password" not in html and "bob" not in roles(team)  # looking changes nothing
    joined = join(bob)
    assert joined.status_code == 302 and joined["Location"] == MEMBERS
    assert roles(team)["bob"] == "member" and roles(other_team) == {"bob": "member"}
    invitation.refresh_from_db()
    assert invitation.used_at is not None and invitation.user == outsider
    joined_entry = AuditEntry.objects.get(action="team.member-join")
    assert joined_entry.actor == "bob" and joined_entry.after["invited_by"] == "adele"
    assert invite(admin_client, "bob@example.com").status_code == 302  # again: already a member, nothing new
    assert Membership.objects.filter(team=team, user=outsider).count() == 1 and len(mail.outbox) == 1


def test_the_admin_is_told_the_same_whether_or_not_the_address_has_an_account(admin_client, outsider):
    outsider.email = "bob@example.com"
    outsider.save()
    told = []
    with time_machine.travel(timezone.now(), tick=False):
        for email in ("bob@example.com", "nobody@example.com"):
            page = admin_client.post(MEMBERS, {"email": email}, follow=True).content.decode()
            told.append(re.search(r'class="msg-[^"]*">([^<]*)<', page).group(1).replace(email, "ADDRESS"))
    assert told[0] == told[1] and "Invitation sent to ADDRESS" in told[0]


def test_someone_else_signed_in_cannot_use_a_link_for_an_account_and_it_stays_unspent(
    admin_client, team, outsider
):
    outsider.email = "bob@example.com"
    outsider.save()
    invite(admin_client, "bob@example.com")
    eve_account = UserFactory(username="eve")
    eve = signed_in(eve_account)
    shown = eve.get(invitation_path(), follow=True)
    html = shown.content.decode()
    assert shown.status_code == 403 and "bob@example.com" in html and "eve" in html
    assert "Join team" not in html
    refused = join(eve)
    assert refused.status_code == 403
    assert roles(team) == {"adele": "admin"}
    assert TeamInvitation.objects.get().used_at is None
    assert not AuditEntry.objects.filter(action="team.member-join").exists()
    with pytest.raises(members.InvitationRefused, match="signed in as"):
        members.accept_team_invitation(
            digest=TeamInvitation.objects.get().digest, user=eve_account, now=timezone.now()
        )
    assert join(signed_in(outsider), invitation_path()).status_code == 302  # bob himself still can


def test_a_signed_out_visitor_is_offered_sign_in_and_joins_once_signed_in_as_the_account(
    admin_client, team, outsider
):
    outsider.email = "bob@example.com"
    outsider.set_password(PASSWORD)
    outsider.save()
    invite(admin_client, "bob@example.com")
    browser = Client()
    shown = browser.get(invitation_path(), follow=True)
    html = shown.content.decode()
    sign_in = f"{reverse('accounts:login')}?next={JOIN}"
    assert shown.status_code == 200 and sign_in in html and "Set your password" not in html
    assert join(browser).status_code == 409 and "bob" not in roles(team)  # signed out, Join does nothing
    signed = browser.post(reverse("accounts:login"), {"username": "bob@example.com", "password": PASSWORD,
                                                      "next": JOIN})  # fmt: skip
    assert signed.status_code == 302 and signed["Location"] == JOIN
    assert "Join team" in browser.get(JOIN).content.decode()  # the link is still this browser's
    assert join(browser).status_code == 302 and roles(team)["bob"] == "member"


def test_a_deactivated_account_cannot_join(team, team_admin, outsider):
    outsider.email = "bob@example.com"
    outsider.save()
    invited = members.invite_member(team=team, email="bob@example.com", actor=team_admin, now=timezone.now())
    outsider.is_active = False
    outsider.save()
    with pytest.raises(members.InvitationRefused, match="deactivated"):
        members.accept_team_invitation(
            digest=selectors.link_digest(invited.token), user=outsider, now=timezone.now()
        )
    assert "bob" not in roles(team) and TeamInvitation.objects.get().used_at is None


def test_an_account_that_joined_meanwhile_is_told_it_is_a_member_and_the_link_stays_unspent(
    admin_client, team, outsider
):
    outsider.email = "bob@example.com"
    outsider.save()
    invite(admin_client, "bob@example.com")
    MembershipFactory(team=team, user=outsider)  # an operator added bob while the e-mail was on its way
    bob = signed_in(outsider)
    shown = bob.get(invitation_path(), follow=True).content.decode()
    assert "already a member of team" in shown and "Join team" not in shown
    assert join(bob).status_code == 409
    with pytest.raises(members.InvitationRefused, match="already a member"):
        members.accept_team_invitation(
            digest=TeamInvitation.objects.get().digest, user=outsider, now=timezone.now()
        )
    assert TeamInvitation.objects.get().used_at is None
    assert not AuditEntry.objects.filter(action="team.member-join").exists()


@pytest.mark.django_db(transaction=True)
def test_two_confirmations_of_one_link_at_once_make_one_membership(team, team_admin, outsider, monkeypatch):
    """Join pressed in two tabs at once: both read the open link before either claims it; one joins, the other
    is refused (never a database error)."""
    outsider.email = "bob@example.com"
    outsider.save()
    invited = members.invite_member(team=team, email="bob@example.com", actor=team_admin, now=timezone.now())
    digest = selectors.link_digest(invited.token)
    barrier, read = threading.Barrier(2), selectors.usable_team_invitation

    def read_then_wait(**kwargs):
        found = read(**kwargs)
        barrier.wait(timeout=5)  # both have found the link open before either claims it
        return found

    monkeypatch.setattr(selectors, "usable_team_invitation", read_then_wait)
    confirm = functools.partial(
        members.accept_team_invitation, digest=digest, user=outsider, now=timezone.now()
    )
    assert sorted(at_once(confirm, confirm)) == ["joined", "refused"]
    assert Membership.objects.filter(team=team, user=outsider).count() == 1
    assert AuditEntry.objects.filter(action="team.member-join").count() == 1


# --- Roles and removal --------------------------------------------------------------------------------


def test_an_admin_makes_a_member_admin_and_back(admin_client, team, member):
    url = reverse("accounts:member-role", args=["vision", member.id])
    assert admin_client.post(url, {"role": "admin"}).status_code == 302
    assert roles(team)["alice"] == "admin"
    assert admin_client.post(url, {"role": "member"}).status_code == 302
    assert roles(team)["alice"] == "member"
    assert admin_client.post(url, {"role": "owner"}).status_code == 409


def test_the_last_admin_can_be_neither_demoted_nor_removed(admin_client, team, team_admin, member):
    demote = admin_client.post(
        reverse("accounts:member-role", args=["vision", team_admin.id]), {"role": "member"}
    )
    assert demote.status_code == 409 and "only admin" in demote.content.decode()
    remove = admin_client.post(reverse("accounts:member-remove", args=["vision", team_admin.id]))
    assert remove.status_code == 409
    assert roles(team) == {"adele": "admin", "alice": "member"}
    MembershipFactory(team=team, user=UserFactory(username="abe"), role="admin")
    assert (
        admin_client.post(reverse("accounts:member-remove", args=["vision", team_admin.id])).status_code
        == 302
    )
    assert roles(team) == {"abe": "admin", "alice": "member"}


def test_the_page_offers_the_only_admin_no_change_it_would_refuse_and_says_why(
    admin_client, team, team_admin
):
    """The team's only admin is offered no "Make member" or "Remove" (each would answer 409): the page says why."""
    MembershipFactory(team=team, user=UserFactory(username="abe", is_active=False), role="admin")
    page = admin_client.get(MEMBERS).content.decode()
    demote = reverse("accounts:member-role", args=["vision", team_admin.id])
    remove = reverse("accounts:member-remove", args=["vision", team_admin.id])
    assert demote not in page and remove not in page
    assert "the team's only admin who can sign in: make another member an admin first" in page
    MembershipFactory(team=team, user=UserFactory(username="ada"), role="admin")
    page = admin_client.get(MEMBERS).content.decode()
    assert demote in page and remove in page and "only admin" not in page


@pytest.mark.django_db(transaction=True)
def test_two_demotions_at_once_leave_the_team_one_admin(team, operator):
    """Each sees the other admin before it changes anything; the team's lock makes the second see the first."""
    assert connection.vendor == "postgresql"
    admins = [
        MembershipFactory(team=team, user=UserFactory(username=n), role="admin").user for n in ("ann", "abe")
    ]
    barrier, outcomes = threading.Barrier(2), []

    def demote(user, hold: bool):
        try:
            with transaction.atomic():
                barrier.wait()
                if not hold:
                    barrier.wait()  # the other has taken the lock and demoted first
                members.change_role(
                    team=team, user_id=user.id, role="member", actor=operator, now=timezone.now()
                )
                if hold:
                    barrier.wait()
                    threading.Event().wait(0.3)  # still holding the lock while the other asks for it
            outcomes.append("demoted")
        except members.MembershipRefused:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=demote, args=(a, i == 0)) for i, a in enumerate(admins)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["demoted", "refused"]
    assert list(roles(team).values()).count("admin") == 1


def test_an_admin_who_leaves_the_team_lands_on_their_jobs_list_and_is_told_they_left(
    admin_client, team, team_admin
):
    MembershipFactory(team=team, user=UserFactory(username="abe"), role="admin")
    url = reverse("accounts:member-remove", args=["vision", team_admin.id])
    response = admin_client.post(url, follow=True)
    assert response.redirect_chain == [(reverse("jobs:list"), 302)] and response.status_code == 200
    assert "vision: you left the team." in response.content.decode()
    assert "adele" not in roles(team)


def test_a_member_who_is_not_an_admin_leaves_the_team_from_its_members_page(
    member_client, member, team, team_admin
):
    """Leaving was open to admins only: a member was answered 403 "only a team admin changes the team's members",
    and the page offered no way out. Their jobs there that hold no GPUs yet go with them, as for a removal."""
    waiting = JobFactory(team=team, submitted_by=member, state="queued")
    page = member_client.get(MEMBERS).content.decode()
    leave = reverse("accounts:member-remove", args=["vision", member.id])
    assert f'action="{leave}"' in page and "Leave the team" in page
    response = member_client.post(leave, follow=True)
    assert response.redirect_chain == [(reverse("jobs:list"), 302)]
    assert "vision: you left the team." in response.content.decode()
    assert roles(team) == {"adele": "admin"}
    waiting.refresh_from_db()
    assert (waiting.state, waiting.end_reason) == (
        "ended",
        "cancelled",
    ) and "alice left team" in waiting.end_detail
    entry = AuditEntry.objects.get(action="team.member-remove")
    assert (entry.actor, entry.before["member"]) == ("alice", "alice")


def test_a_deactivated_admin_does_not_count_as_the_teams_admin(admin_client, team, team_admin):
    """A team keeps an admin who can sign in: a deactivated account manages nothing."""
    MembershipFactory(team=team, user=UserFactory(username="abe", is_active=False), role="admin")
    demote = admin_client.post(
        reverse("accounts:member-role", args=["vision", team_admin.id]), {"role": "member"}
    )
    assert demote.status_code == 409 and "only admin who can sign in" in demote.content.decode()
    remove = admin_client.post(reverse("accounts:member-remove", args=["vision", team_admin.id]))
    assert remove.status_code == 409
    assert roles(team) == {"adele": "admin", "abe": "admin"}


def test_a_demoted_or_removed_admins_pending_links_stop_working(admin_client, team, team_admin):
    """A link speaks for the admin who sent it: a rogue admin removed must not let their friends in later."""
    rex, roy = (
        MembershipFactory(team=team, user=UserFactory(username=n), role="admin").user for n in ("rex", "roy")
    )
    now = timezone.now()
    links = {
        email: reverse(
            "invite", args=[members.invite_member(team=team, email=email, actor=by, now=now).token]
        )
        for by, email in (
            (rex, "mallory@example.com"),
            (roy, "trent@example.com"),
            (team_admin, "carol@example.com"),
        )
    }
    admin_client.post(reverse("accounts:member-remove", args=["vision", rex.id]))
    admin_client.post(reverse("accounts:member-role", args=["vision", roy.id]), {"role": "member"})
    assert set_password(Client(), links["mallory@example.com"]).status_code == 410
    assert set_password(Client(), links["trent@example.com"]).status_code == 410
    assert set_password(Client(), links["carol@example.com"]).status_code == 302  # adele is still an admin
    cancels = AuditEntry.objects.filter(action="team.invitation-cancel").order_by("id")
    assert [(e.actor, e.before) for e in cancels] == [
        ("adele", {"invited": "mallory@example.com", "invited_by": "rex"}),
        ("adele", {"invited": "trent@example.com", "invited_by": "roy"}),
    ]


def test_a_removed_member_loses_the_teams_jobs_at_once(admin_client, member_client, team, member):
    job = JobFactory(team=team)
    url = reverse("jobs:detail", args=[job.id])
    assert member_client.get(url).status_code == 200
    assert admin_client.post(reverse("accounts:member-remove", args=["vision", member.id])).status_code == 302
    assert member_client.get(url).status_code == 404
    assert member_client.get(MEMBERS).status_code == 404


# --- The audit log and the partners' invitations ------------------------------------------------------


def test_every_membership_change_is_in_the_operators_audit_log(admin_client, team, member, outsider):
    outsider.email = "bob@example.com"
    outsider.save()
    invite(admin_client, "carol@example.com")
    set_password(Client(), invitation_path())
    invite(admin_client, "bob@example.com")
    join(signed_in(outsider), invitation_path())
    invite(admin_client, "dan@example.com")
    admin_client.post(
        reverse(
            "accounts:invitation-cancel",
            args=["vision", TeamInvitation.objects.get(email="dan@example.com").id],
        )
    )
    admin_client.post(reverse("accounts:member-role", args=["vision", member.id]), {"role": "admin"})
    admin_client.post(reverse("accounts:member-remove", args=["vision", outsider.id]))
    entries = list(AuditEntry.objects.order_by("id").values_list("actor", "action", "target"))
    assert entries == [
        ("adele", "team.member-invite", "team:vision"),
        ("carol@example.com", "team.member-join", "team:vision"),
        ("adele", "team.member-invite", "team:vision"),
        ("bob", "team.member-join", "team:vision"),
        ("adele", "team.member-invite", "team:vision"),
        ("adele", "team.invitation-cancel", "team:vision"),
        ("adele", "team.member-role", "team:vision"),
        ("adele", "team.member-remove", "team:vision"),
    ]
    role = AuditEntry.objects.get(action="team.member-role")
    assert (role.before, role.after) == (
        {"member": "alice", "role": "member"},
        {"member": "alice", "role": "admin"},
    )


def test_cancelling_an_invitation_used_or_cancelled_already_says_nothing_was_cancelled(admin_client, team):
    invite(admin_client, "carol@example.com")
    used = TeamInvitation.objects.get()
    assert set_password(Client(), invitation_path()).status_code == 302  # carol joins while the page is open
    response = admin_client.post(reverse("accounts:invitation-cancel", args=["vision", used.id]))
    assert response.status_code == 409
    assert "carol@example.com had already used this invitation" in response.context["error"]
    invite(admin_client, "dan@example.com")
    cancel = reverse(
        "accounts:invitation-cancel", args=["vision", TeamInvitation.objects.get(email="dan@example.com").id]
    )
    assert admin_client.post(cancel).status_code == 302
    again = admin_client.post(cancel)
    assert again.status_code == 409 and "already been cancelled" in again.context["error"]
    assert AuditEntry.objects.filter(action="team.invitation-cancel").count() == 1


def test_a_refused_change_leaves_no_audit_entry(admin_client, team_admin):
    admin_client.post(reverse("accounts:member-remove", args=["vision", team_admin.id]))
    assert not AuditEntry.objects.exists()


def test_a_design_partners_invitation_still_makes_the_teams_admin(operator):
    application = ApplicationFactory(email="eve@example.com")
    application, token = public_services.accept_application(
        application_id=application.id, team_name="Footage Lab", by=operator.username, now=timezone.now()
    )
    contact = Client()
    path = reverse("invite", args=[token])
    assert "the admin of team" in contact.get(path, follow=True).content.decode()
    assert set_password(contact, path).status_code == 302
    assert roles(application.team) == {"eve@example.com": "admin"}
    assert contact.get(reverse("accounts:members", args=[application.team.slug])).context["is_admin"]


def _pending_invitation(team, by, *, digest: str = "a" * 64) -> TeamInvitation:
    now = timezone.now()
    return TeamInvitation.objects.create(
        team=team,
        email="dan@example.com",
        digest=digest,
        invited_by=by,
        created_at=now,
        expires_at=now + timedelta(days=7),
    )


def test_invitation_links_start_with_the_consoles_address_not_the_requests_host(admin_client, settings):
    """Behind a proxy the admin's request may come in as plain HTTP on an internal host name: the single-use link
    that creates an account (or lets one join) must not go out as http://10.0.0.5/invite/..."""
    settings.E31_CONSOLE_URL = "https://console.e31.example"
    settings.ALLOWED_HOSTS = ["console.e31.example", "10.0.0.5"]
    admin_client.post(MEMBERS, {"email": "newcomer@example.org"}, HTTP_HOST="10.0.0.5")
    assert "https://console.e31.example/invite/" in mail.outbox[-1].body
    UserFactory(username="olga", email="olga@example.org")
    admin_client.post(MEMBERS, {"email": "olga@example.org"}, HTTP_HOST="10.0.0.5")
    assert "https://console.e31.example/invite/" in mail.outbox[-1].body
