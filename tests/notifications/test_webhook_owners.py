"""A webhook speaks for the admin who added it: once they are no admin of the team (removed, or made a member), it
is removed with them, audited, as their invitations are; every webhook added or removed is in the audit log, and the
team's page says who added each."""

import ipaddress

import pytest
from django.utils import timezone

from accounts import members
from notifications import services as notify
from notifications.models import Webhook, WebhookDelivery
from operations.models import AuditEntry
from tests.factories import JobFactory, MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db
URL = "http://10.2.3.4/hook"


@pytest.fixture(autouse=True)
def private_target_allowed(settings):
    settings.E31_WEBHOOK_PRIVATE_NETWORKS = [ipaddress.ip_network("10.0.0.0/8")]


@pytest.fixture
def mallory(team):
    return MembershipFactory(team=team, user=UserFactory(username="mallory"), role="admin").user


def _add(team, user, url=URL) -> Webhook:
    return notify.add_webhook(team=team, user=user, url=url, secret="", now=timezone.now())


def test_a_removed_admins_webhooks_are_removed_with_them_and_hear_no_more_events(team, team_admin, mallory):
    """Reproduction: mallory, an admin, added a webhook and was removed; every later event of the team's jobs was
    still delivered to her URL (id, name, state, end reason, exit code, detail)."""
    hers, kept = _add(team, mallory), _add(team, team_admin, "http://10.9.9.9/team")
    hers_id = hers.id
    assert members.remove_member(team=team, user_id=mallory.id, actor=team_admin, now=timezone.now())
    assert list(Webhook.objects.values_list("id", flat=True)) == [kept.id]
    job = JobFactory(team=team)
    notify.record_job_event(job_id=job.id, event="ended", attempt=1, now=timezone.now())
    assert [d.webhook_id for d in WebhookDelivery.objects.all()] == [kept.id]
    entry = AuditEntry.objects.get(action="team.webhook-remove")
    assert (entry.actor, entry.target) == ("adele", f"team:{team.slug}")
    assert entry.before == {"webhook": hers_id, "host": "10.2.3.4", "added_by": "mallory"}


def test_a_demoted_admins_webhooks_are_removed_and_a_members_role_change_to_admin_keeps_them(
    team, team_admin, mallory
):
    _add(team, mallory)
    assert members.change_role(
        team=team, user_id=mallory.id, role="member", actor=team_admin, now=timezone.now()
    )
    assert not Webhook.objects.exists()
    assert members.change_role(
        team=team, user_id=mallory.id, role="admin", actor=team_admin, now=timezone.now()
    )
    theirs = _add(team, mallory)
    assert list(Webhook.objects.all()) == [theirs]


def test_adding_and_removing_a_webhook_is_audited_by_host_never_by_the_secret_its_url_may_carry(
    team, team_admin
):
    hook = _add(team, team_admin, url="http://10.2.3.4/services/T0/B0/receivers-own-token")
    said = {"webhook": hook.id, "host": "10.2.3.4", "added_by": "adele"}
    notify.remove_webhook(webhook=hook, user=team_admin, now=timezone.now())
    entries = list(AuditEntry.objects.order_by("id").values_list("action", "actor", "before", "after"))
    assert entries == [("team.webhook-add", "adele", {}, said), ("team.webhook-remove", "adele", said, {})]
    assert "receivers-own-token" not in str(list(AuditEntry.objects.values()))


def test_the_webhooks_page_says_who_added_each(client, team, team_admin, mallory):
    _add(team, mallory)
    client.force_login(team_admin)
    page = client.get(f"/notifications/webhooks/{team.slug}/").content.decode()
    assert "added by mallory" in page


def _deactivated(user):
    user.is_active = False
    user.save(update_fields=["is_active"])


def _no_longer_operator(user):
    user.is_staff = False
    user.save(update_fields=["is_staff"])


@pytest.mark.parametrize("loses_rights", [_deactivated, _no_longer_operator, lambda user: user.delete()])
def test_a_webhook_whose_adder_no_longer_speaks_for_the_team_hears_no_more_events(team, loses_rights):
    """Reproduction: an operator (no member) added a webhook to vision, then lost operator rights, or the adder was
    deactivated or deleted; no membership changed, so nothing removed the webhook, and every later event of the
    team's jobs was still delivered to that URL. A delivery already queued is not sent either."""
    adder = UserFactory(username="oscar", is_staff=True)
    hook = _add(team, adder)
    job = JobFactory(team=team)
    notify.record_job_event(job_id=job.id, event="started", attempt=1, now=timezone.now())
    queued = WebhookDelivery.objects.get(webhook=hook)

    loses_rights(adder)
    notify.record_job_event(job_id=job.id, event="ended", attempt=1, now=timezone.now())

    assert list(WebhookDelivery.objects.values_list("id", flat=True)) == [queued.id]
    assert notify.deliver_webhook(delivery_id=queued.id, now=timezone.now()) == WebhookDelivery.FAILED
    refused = queued.tries.get()
    assert refused.status is None and "no longer speaks for team" in refused.response


def test_the_webhooks_page_says_which_webhook_is_sent_nothing_and_why(client, team, team_admin, mallory):
    """A webhook whose adder was deactivated is sent nothing: its team's admins see it on the page, not only
    in its refused tries."""
    _add(team, mallory)
    mallory.is_active = False
    mallory.save(update_fields=["is_active"])
    client.force_login(team_admin)
    page = client.get(f"/notifications/webhooks/{team.slug}/").content.decode()
    assert "sent nothing" in page and "no longer speaks for the team" in page
