"""The notification pages: e-mail choices per team, the webhooks page with each delivery and its response."""

import pytest
from django.utils import timezone

from notifications.models import EmailPreference, Webhook, WebhookAttempt, WebhookDelivery
from tests.factories import JobFactory, WebhookFactory

pytestmark = pytest.mark.django_db


def test_a_member_chooses_email_per_team(member_client, member, team):
    page = member_client.get("/notifications/")
    assert page.status_code == 200 and f'name="team-{team.id}"' in page.content.decode()
    assert member_client.post("/notifications/", {f"team-{team.id}": "failure"}).status_code == 302
    assert EmailPreference.objects.get(user=member, team=team).email == "failure"


def test_the_webhooks_page_shows_each_delivery_and_its_response(
    member_client, team, django_assert_max_num_queries
):
    hook = WebhookFactory(
        team=team, url="https://hooks.example/e31", secret="x" * 20, created_at=timezone.now()
    )
    for i in range(5):
        job = JobFactory(team=team)
        delivery = WebhookDelivery.objects.create(
            webhook=hook, event_key=f"k{i}", event="ended", job=job, payload={}, state="pending", attempts=1,
            next_attempt_at=timezone.now(), created_at=timezone.now(),
        )  # fmt: skip
        WebhookAttempt.objects.create(
            delivery=delivery, number=1, at=timezone.now(), status=500, response="boom"
        )
    with django_assert_max_num_queries(12):
        page = member_client.get(f"/notifications/webhooks/{team.slug}/")
    html = page.content.decode()
    assert (
        page.status_code == 200
        and "HTTP 500" in html
        and "boom" in html
        and "https://hooks.example/…" in html
    )
    assert "x" * 20 not in html  # the secret is shown once, when added, never again


def test_a_webhooks_path_and_query_are_shown_to_the_teams_admins_only(
    member_client, team, team_admin, client
):
    """Reproduction: every member saw each webhook's whole URL, whose path and query often carry the receiver's
    own secret (a chat service's incoming-webhook token), which the audit log keeps out for that reason: any
    member could post into the channel, and still could once removed."""
    WebhookFactory(team=team, url="https://chat.example/services/T0/B0/s3cretTok3n?key=k3y")
    as_member = member_client.get(f"/notifications/webhooks/{team.slug}/").content.decode()
    client.force_login(team_admin)
    as_admin = client.get(f"/notifications/webhooks/{team.slug}/").content.decode()
    assert "https://chat.example/…" in as_member and "s3cretTok3n" not in as_member and "k3y" not in as_member
    assert "https://chat.example/services/T0/B0/s3cretTok3n?key=k3y" in as_admin


def test_a_team_admin_adds_a_webhook_and_sees_its_secret_once(team_admin, team, settings):
    import ipaddress

    from django.test import Client

    settings.E31_WEBHOOK_PRIVATE_NETWORKS = [ipaddress.ip_network("10.0.0.0/8")]
    client = Client()
    client.force_login(team_admin)
    page = client.post(f"/notifications/webhooks/{team.slug}/", {"url": "http://10.2.3.4/hook", "secret": ""})
    hook = Webhook.objects.get()
    assert page.status_code == 200 and hook.secret in page.content.decode()
    refused = client.post(f"/notifications/webhooks/{team.slug}/", {"url": "http://127.0.0.1:8000/"})
    assert refused.status_code == 422 and "refused" in refused.content.decode()
    assert client.post(f"/notifications/webhooks/{team.slug}/{hook.id}/remove/").status_code == 302
    assert not Webhook.objects.exists()


def test_a_member_cannot_add_nor_remove_webhooks(member_client, team):
    hook = WebhookFactory(team=team, url="https://hooks.example/", secret="x" * 20, created_at=timezone.now())
    assert (
        member_client.post(f"/notifications/webhooks/{team.slug}/", {"url": "https://a.example/"}).status_code
        == 422
    )
    member_client.post(f"/notifications/webhooks/{team.slug}/{hook.id}/remove/")
    assert Webhook.objects.count() == 1


def test_another_teams_webhooks_do_not_exist_for_an_outsider(outsider_client, team):
    hook = WebhookFactory(team=team, url="https://hooks.example/", secret="x" * 20, created_at=timezone.now())
    assert outsider_client.get(f"/notifications/webhooks/{team.slug}/").status_code == 404
    assert outsider_client.post(f"/notifications/webhooks/{team.slug}/{hook.id}/remove/").status_code == 404
    assert Webhook.objects.count() == 1
