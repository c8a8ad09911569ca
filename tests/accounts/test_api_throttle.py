"""The API throttle: E31_API_RATE requests per token, then 429 with Retry-After; other tokens are not slowed."""

import logging
import time

import pytest
from django.urls import reverse
from django.utils import timezone

from accounts import services
from accounts.models import ApiToken
from accounts.views import TOKENS_PER_DAY

pytestmark = pytest.mark.django_db
JOBS = "/api/v1/jobs"


@pytest.fixture(autouse=True)
def _three_a_day(settings):
    # Windows are aligned to the clock: a day's keeps each test inside one window (bar UTC midnight).
    settings.E31_API_RATE = "3/d"


def _bearer(user, label: str = "cli") -> dict:
    _, token = services.create_api_token(user=user, label=label)
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def test_a_token_past_its_rate_gets_429_with_retry_after(client, member, caplog):
    caplog.set_level(logging.WARNING, logger="e31.denials")
    token = _bearer(member)
    assert [client.get(JOBS, **token).status_code for _ in range(3)] == [200, 200, 200]
    refused = client.get(JOBS, **token)
    assert refused.status_code == 429
    until_the_next_window = 86400 - time.time() % 86400
    assert abs(int(refused["Retry-After"]) - until_the_next_window) <= 2
    assert refused.json() == {"detail": "Too many requests."}
    assert [(r.status, r.path) for r in caplog.records if r.name == "e31.denials"] == [(429, JOBS)]


def test_the_count_is_per_token_not_per_address(client, member, outsider):
    first, second = _bearer(member, "laptop"), _bearer(outsider, "ci")
    for _ in range(3):
        client.get(JOBS, **first)
    assert client.get(JOBS, **first).status_code == 429
    assert client.get(JOBS, **second).status_code == 200  # same address, another token


def test_a_second_token_of_the_same_user_has_its_own_count(client, member):
    first, second = _bearer(member, "laptop"), _bearer(member, "ci")
    for _ in range(3):
        client.get(JOBS, **first)
    assert client.get(JOBS, **first).status_code == 429
    assert client.get(JOBS, **second).status_code == 200


def test_a_browser_session_is_counted_per_user(member_client):
    assert [member_client.get(JOBS).status_code for _ in range(4)] == [200, 200, 200, 429]


def test_bad_tokens_count_per_address_and_past_the_rate_get_429_with_retry_after(client, member):
    """Authentication runs before ninja's throttles: a flood of bad tokens was answered 401 for ever."""
    bad = {"HTTP_AUTHORIZATION": "Bearer e31_not-a-token"}
    assert [client.get(JOBS, **bad).status_code for _ in range(3)] == [401, 401, 401]
    refused = client.get(JOBS, **bad)
    assert refused.status_code == 429
    assert abs(int(refused["Retry-After"]) - (86400 - time.time() % 86400)) <= 2
    assert client.get(JOBS, **_bearer(member)).status_code == 200  # a good token is counted on its own


def test_a_user_cannot_multiply_their_rate_by_making_tokens(client, member):
    """Each token has its own count, and tokens were free to make: five tokens at "2/d" sent ten requests, all
    answered 200. A user holds at most ACTIVE_TOKENS live tokens, so what one user may send is bounded."""
    tokens = [_bearer(member, f"t{n}") for n in range(services.ACTIVE_TOKENS)]
    with pytest.raises(services.TooManyTokens, match=f"{services.ACTIVE_TOKENS} active tokens"):
        services.create_api_token(user=member, label="one more")
    answered = [client.get(JOBS, **token).status_code for token in tokens for _ in range(4)]
    assert answered.count(200) == 3 * services.ACTIVE_TOKENS and answered.count(429) == services.ACTIVE_TOKENS


def test_revoking_and_making_tokens_in_turn_never_passes_the_users_own_bound(
    client, member, still_rate_clock
):
    """Found by review: counted per token only, a user who revoked each token at its rate and made the next got
    the rate again and again. A user's tokens together get at most ACTIVE_TOKENS times the rate, as the README
    says, however many come and go; and the token page makes at most TOKENS_PER_DAY a day."""
    answered = 0
    for _ in range(services.ACTIVE_TOKENS + 2):
        row, token = services.create_api_token(user=member, label="turn")
        answered += sum(
            client.get(JOBS, HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200 for _ in range(4)
        )
        services.revoke_api_token(token_id=row.id, user=member, now=timezone.now())
    assert answered == 3 * services.ACTIVE_TOKENS


def test_the_token_page_makes_a_bounded_number_of_tokens_a_day(member_client, member, still_rate_clock):
    made = []
    for i in range(TOKENS_PER_DAY):
        made.append(member_client.post(reverse("accounts:tokens"), {"label": f"t{i}"}).status_code)
        for row in ApiToken.objects.filter(
            user=member, revoked_at__isnull=True
        ):  # the live-token bound aside
            services.revoke_api_token(token_id=row.id, user=member, now=timezone.now())
    assert made == [302] * TOKENS_PER_DAY
    refused = member_client.post(reverse("accounts:tokens"), {"label": "one more"})
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert "No token was created" in refused.content.decode()
    assert ApiToken.objects.filter(user=member).count() == TOKENS_PER_DAY
