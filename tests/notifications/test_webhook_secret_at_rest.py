"""A webhook's signing secret is kept encrypted under the secrets keys (E31_SECRETS_KEYS), like team secrets.

Found by reading the schema: the secret every event is signed with sat in notifications_webhook as plain text,
so whoever read the database, or a backup of it, could sign events any team's receiver would accept as E31's.
"""

from io import StringIO

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from notifications import services as notify
from notifications import signing
from notifications.models import Webhook, WebhookAttempt, WebhookDelivery
from tests.factories import JobFactory, MembershipFactory, UserFactory
from tests.schema_states import migrated_back

pytestmark = pytest.mark.django_db

SECRET = "whsec-receiver-checks-this-0123456789"


@pytest.fixture
def secrets_key(settings):
    settings.E31_SECRETS_KEYS = [Fernet.generate_key().decode()]
    return settings.E31_SECRETS_KEYS[0]


def _stored() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT row_to_json(w)::text FROM notifications_webhook w")
        return "".join(row[0] for row in cursor.fetchall())


def _added(team, url: str) -> Webhook:
    admin = MembershipFactory(team=team, user=UserFactory(username="ada"), role="admin").user
    return notify.add_webhook(team=team, user=admin, url=url, secret=SECRET, now=timezone.now())


def test_the_secret_is_never_stored_readable_and_still_signs_every_event(
    team, secrets_key, receiver, loopback_allowed
):
    _added(team, receiver.url)
    assert SECRET not in _stored()
    headers = signing.headers(secret=Webhook.objects.get().secret, event_id="e1", timestamp=1, body=b"{}")
    assert signing.verify(SECRET, headers, b"{}", now=1)


def test_rotating_the_secrets_key_reencrypts_webhook_secrets_too(
    team, secrets_key, settings, receiver, loopback_allowed
):
    _added(team, receiver.url)
    new = Fernet.generate_key().decode()
    settings.E31_SECRETS_KEYS = [new, secrets_key]
    call_command("rotate_secrets_key")
    settings.E31_SECRETS_KEYS = [new]
    assert Webhook.objects.get().secret == SECRET


def test_a_secret_the_keys_no_longer_open_is_a_failed_try_saying_why_not_a_crash(
    team, secrets_key, settings, receiver, loopback_allowed
):
    _added(team, receiver.url)
    job = JobFactory(team=team, state="running")
    delivery = WebhookDelivery.objects.create(
        webhook=Webhook.objects.get(), event_key=f"job:{job.id}:1:ended", event="ended", job=job,
        payload={"type": "ended"}, next_attempt_at=timezone.now(), created_at=timezone.now(),
    )  # fmt: skip
    settings.E31_SECRETS_KEYS = [Fernet.generate_key().decode()]  # the key it was sealed under was dropped
    assert notify.deliver_webhook(delivery_id=delivery.id, now=timezone.now()) == "pending"
    attempt = WebhookAttempt.objects.get()
    assert attempt.status is None and "E31_SECRETS_KEYS cannot open" in attempt.response
    assert receiver.requests == []  # nothing goes out unsigned


@pytest.mark.django_db(transaction=True)
def test_secrets_stored_in_clear_before_are_sealed_when_it_is_deployed(team, secrets_key):
    with migrated_back([("notifications", "0004_job_email_backoff")]) as old:
        old.get_model("notifications", "Webhook").objects.create(
            team_id=team.id, url="https://hooks.example/e31", secret=SECRET, created_at=timezone.now()
        )
    assert SECRET not in _stored() and Webhook.objects.get().secret == SECRET

    with migrated_back([("notifications", "0004_job_email_backoff")]):  # undone, the secret is back as it was
        with connection.cursor() as cursor:
            cursor.execute("SELECT secret FROM notifications_webhook")
            assert cursor.fetchall() == [(SECRET,)]


def test_a_rotation_names_the_webhooks_no_key_opens_and_still_rotates_the_rest(
    team, secrets_key, settings, receiver, loopback_allowed
):
    """Found in review: one webhook secret sealed under a key since dropped stopped the command with a bare
    InvalidToken, after the team secrets had already been rotated, naming nothing."""
    lost = _added(team, receiver.url)
    settings.E31_SECRETS_KEYS = [Fernet.generate_key().decode()]
    kept = notify.add_webhook(
        team=team, user=lost.created_by, url=receiver.url + "?2", secret=SECRET, now=timezone.now()
    )
    new = Fernet.generate_key().decode()
    settings.E31_SECRETS_KEYS = [new, *settings.E31_SECRETS_KEYS]
    err = StringIO()
    call_command("rotate_secrets_key", stdout=StringIO(), stderr=err)
    assert f"webhook(s) {lost.id}" in err.getvalue()
    settings.E31_SECRETS_KEYS = [new]
    assert Webhook.objects.get(id=kept.id).secret == SECRET
