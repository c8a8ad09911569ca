"""A team's webhooks are few and distinct, and none of them can undo the job event that owes it a delivery."""

import threading

import pytest
from django.db import connection
from django.utils import timezone

from accounts.models import Membership
from jobs import transitions
from jobs.lifecycle import EndReason, State
from jobs.models import Job
from notifications import addresses
from notifications import services as notify
from notifications.models import Webhook, WebhookDelivery
from tests.factories import JobFactory, UserFactory, WebhookFactory


def _admin(team):
    user = UserFactory(username="lead")
    Membership.objects.get_or_create(team=team, user=user, defaults={"role": "admin"})
    return user


def _add(team, user, url):
    return notify.add_webhook(team=team, user=user, url=url, secret="", now=timezone.now())


@pytest.mark.django_db
def test_a_team_has_at_most_its_limit_of_webhooks(team, receiver, loopback_allowed, settings):
    """Every event went out to every webhook inside the job's own transaction: an admin with 300 of them made
    one job's end 1,507 queries (1.1 s), and the scheduler pass that ends jobs held its lock that long."""
    settings.E31_WEBHOOKS_PER_TEAM = 3
    admin = _admin(team)
    for n in range(3):
        _add(team, admin, f"{receiver.url}?n={n}")
    with pytest.raises(addresses.Refused, match="at most 3 webhooks"):
        _add(team, admin, f"{receiver.url}?n=3")
    assert Webhook.objects.filter(team=team).count() == 3


@pytest.mark.django_db
def test_the_same_url_twice_is_refused(team, receiver, loopback_allowed):
    """Two webhooks to one URL only send the receiver each event twice, and a page refreshed after an add
    posted it again."""
    admin = _admin(team)
    _add(team, admin, receiver.url)
    with pytest.raises(addresses.Refused, match="already"):
        _add(team, admin, receiver.url)


@pytest.mark.django_db(transaction=True)
def test_a_webhook_removed_while_a_job_ends_leaves_the_end_standing(team, monkeypatch):
    """Removing a webhook committed between the job event's read of the team's webhooks and its insert of their
    deliveries: their foreign key failed at commit, and the job's end - or the whole scheduler pass that ended
    it - rolled back. The removal now waits for the event and takes its deliveries with it."""
    admin = _admin(team)
    removed = WebhookFactory(
        team=team, url="http://hooks.example/a", created_by=admin, created_at=timezone.now()
    )
    kept = WebhookFactory(team=team, url="http://hooks.example/b", created_at=timezone.now())
    job = JobFactory(team=team, state="running")
    speaks_for, removals = notify.selectors.speaks_for, []

    def remove():
        notify.remove_webhook(webhook=Webhook.objects.get(id=removed.id), user=admin, now=timezone.now())
        connection.close()

    def an_admin_removes_a_webhook_meanwhile(user, of_team):
        if not removals:
            removals.append(threading.Thread(target=remove))
            removals[0].start()
            removals[0].join(timeout=1)  # as far as it gets while the event is under way
        return speaks_for(user, of_team)

    monkeypatch.setattr(notify.selectors, "speaks_for", an_admin_removes_a_webhook_meanwhile)
    assert transitions.transition(job_id=job.id, source=State.RUNNING, target=State.RELEASED,
                                  now=timezone.now(), end_reason=EndReason.FAILED)  # fmt: skip
    removals[0].join(timeout=10)
    assert Job.objects.get(id=job.id).state == State.RELEASED
    assert not Webhook.objects.filter(id=removed.id).exists()
    assert list(WebhookDelivery.objects.values_list("webhook_id", flat=True)) == [kept.id]
