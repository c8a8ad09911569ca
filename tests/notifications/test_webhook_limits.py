"""A team's webhooks are few and distinct, and none of them can undo the job event that owes it a delivery."""

import threading
import time

import pytest
from django.db import connection, transaction
from django.utils import timezone

from accounts import members
from accounts.models import Membership, Team
from jobs import dispatch, rental, transitions
from jobs.lifecycle import EndReason, State
from jobs.models import Allocation, Job
from notifications import addresses
from notifications import services as notify
from notifications.models import Webhook, WebhookDelivery
from tests.factories import JobFactory, NodeFactory, UserFactory, WebhookFactory


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


@pytest.mark.django_db(transaction=True)
def test_removing_an_admin_while_a_job_of_the_team_ends_does_not_deadlock(team, monkeypatch):
    """The job event held the team's webhooks until its commit, where its foreign keys took the team row; removing
    an admin took the team row, then that admin's webhooks: each waited for the other."""
    monkeypatch.setattr(dispatch, "send_after_commit", lambda *args, **kwargs: None)
    lead, boss = UserFactory(username="lead"), UserFactory(username="boss")
    for user in (lead, boss):
        Membership.objects.get_or_create(team=team, user=user, defaults={"role": "admin"})
    WebhookFactory(team=team, url="http://hooks.example/a", created_by=lead, created_at=timezone.now())
    NodeFactory(name="solo", gpus=1)
    job = JobFactory(team=team, state=State.QUEUED)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"solo": (0,)}, now=timezone.now())
    part = Allocation.objects.get(job=job)
    assert rental.start_allocation(allocation_id=part.id, now=timezone.now())
    recorded, go_on, outcomes = threading.Event(), threading.Event(), {}
    record = notify.record_job_event

    def paused_after_recording(**kwargs):
        record(**kwargs)
        if threading.current_thread().name == "release":
            recorded.set()
            go_on.wait(10)

    monkeypatch.setattr(notify, "record_job_event", paused_after_recording)

    def run(name, work):
        try:
            work()
            outcomes[name] = "ok"
        except Exception as exc:
            outcomes[name] = repr(exc)[:200]
        finally:
            connection.close()

    release = threading.Thread(
        name="release",
        target=run,
        args=(
            "release",
            lambda: rental.release_part(
                allocation_id=part.id,
                end_reason=EndReason.CANCELLED,
                now=timezone.now(),
                actor="agent:solo",
                detail="",
            ),
        ),
    )
    remove = threading.Thread(name="remove", target=run, args=("remove", lambda: members.remove_member(
        team=team, user_id=lead.id, actor=boss, now=timezone.now())))  # fmt: skip
    release.start()
    assert recorded.wait(10)
    remove.start()
    time.sleep(1)  # the removal is as far as it gets while the job's end is under way
    go_on.set()
    release.join(30)
    remove.join(30)
    assert outcomes == {"release": "ok", "remove": "ok"}


@pytest.mark.django_db(transaction=True)
def test_adding_a_webhook_holds_nothing_of_the_team_while_its_name_resolves(
    team, receiver, loopback_allowed, monkeypatch
):
    """The add locked the team row, then looked the name up (up to E31_WEBHOOK_TIMEOUT_S): the team's submissions
    and every commit that writes a row of the team (a job, a meter row) waited on it."""
    admin, lookup, looking = _admin(team), addresses.socket.getaddrinfo, threading.Event()

    def slow(host, *args, **kwargs):
        if host == "hooks.slow.example":
            looking.set()
            time.sleep(2)
            host = "127.0.0.1"
        return lookup(host, *args, **kwargs)

    monkeypatch.setattr(addresses.socket, "getaddrinfo", slow)

    def add():
        try:
            _add(team, admin, receiver.url.replace("127.0.0.1", "hooks.slow.example"))
        finally:
            connection.close()

    adding = threading.Thread(target=add)
    adding.start()
    assert looking.wait(10)
    began = time.monotonic()
    with transaction.atomic():  # as submit_job takes it
        Team.objects.select_for_update(no_key=True).filter(id=team.id).first()
    waited = time.monotonic() - began
    adding.join(10)
    assert waited < 1.0, f"a submission waited {waited:.1f} s on a webhook's name"
    assert Webhook.objects.filter(team=team).count() == 1
