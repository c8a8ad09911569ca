"""API tokens expire: each is made for 1 to E31_TOKEN_MAX_DAYS days (90 unless chosen), then refused saying so.

A token lived until someone remembered to revoke it: one copied into a laptop's shell history, a CI log or a
departed contractor's script worked for ever. Tokens made before expiry existed keep working (nothing they
run stops without warning) and the page marks them "never"; every new one has an end date, shown beside it.
"""

from datetime import timedelta
from io import StringIO

import pytest
import time_machine
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from accounts import services
from accounts.models import ApiToken

pytestmark = pytest.mark.django_db
JOBS = "/api/v1/jobs"


def _api(client, token):
    return client.get(JOBS, HTTP_AUTHORIZATION=f"Bearer {token}")


def test_a_token_made_for_30_days_works_until_then_and_is_then_refused_saying_when_it_expired(
    member_client, client
):
    made = timezone.now()
    page = member_client.post(reverse("accounts:tokens"), {"label": "laptop", "days": "30"}, follow=True)
    token = page.context["new_token"]
    expires = ApiToken.objects.get().expires_at
    assert abs(expires - (made + timedelta(days=30))) < timedelta(minutes=1)
    assert f"{expires:%Y-%m-%d}" in page.content.decode()
    assert _api(client, token).status_code == 200
    with time_machine.travel(expires + timedelta(seconds=1)):
        refused = _api(client, token)
    assert refused.status_code == 401
    assert f"expired on {expires:%Y-%m-%d %H:%M} UTC" in refused.json()["detail"]


def test_a_token_lasts_90_days_unless_another_length_is_chosen(member_client):
    member_client.post(reverse("accounts:tokens"), {"label": "ci"})
    left = ApiToken.objects.get().expires_at - timezone.now()
    assert timedelta(days=89) < left <= timedelta(days=90)


@pytest.mark.parametrize("days", ["0", "-1", "366", "forever", "1e3"])
def test_a_length_outside_one_day_to_the_most_allowed_is_refused_and_makes_no_token(member_client, days):
    page = member_client.post(reverse("accounts:tokens"), {"label": "x", "days": days})
    assert page.status_code == 422 and "1 to 365 days" in page.content.decode()
    assert not ApiToken.objects.exists()


def test_a_token_made_before_expiry_existed_keeps_working_and_reads_never(member, member_client, client):
    _, token = services.create_api_token(user=member, label="old", days=30)
    ApiToken.objects.update(expires_at=None)
    assert _api(client, token).status_code == 200
    assert "never" in member_client.get(reverse("accounts:tokens")).content.decode()


def test_the_command_makes_a_token_for_the_days_asked(member):
    call_command("create_api_token", "alice", "--days", "7", stdout=StringIO())
    left = ApiToken.objects.get().expires_at - timezone.now()
    assert timedelta(days=6) < left <= timedelta(days=7)
    with pytest.raises(CommandError, match="1 to 365 days"):
        call_command("create_api_token", "alice", "--days", "400", stdout=StringIO())
