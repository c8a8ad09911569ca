"""The operator's queue: every waiting job in priority order with its components, reservation and estimate."""

from datetime import timedelta

import pytest
from django.urls import reverse

from jobs import scheduler
from jobs.lifecycle import State
from operations import services
from tests.factories import JobFactory
from tests.operations.conftest import HTMX, running_job

pytestmark = pytest.mark.django_db
QUEUE = reverse("operations:queue")


def _waiting(team, *, name: str, priority: float | None, gpus: int = 1, state: str = State.QUEUED, **fields):
    detail = (
        {}
        if priority is None
        else {"fairshare": 0.5, "age": priority - 0.75, "size": 0.25, "total": priority, "starved": 0.0}
    )
    return JobFactory(
        team=team, name=name, gpus=gpus, state=state, priority=priority, priority_detail=detail, **fields
    )


def test_waiting_jobs_are_listed_in_priority_order_with_their_components(operator_client, team, other_team):
    _waiting(team, name="low", priority=1.25)
    _waiting(other_team, name="high", priority=2.5, state=State.STAGING)
    _waiting(team, name="unranked", priority=None, state=State.SUBMITTED)
    JobFactory(team=team, name="finished", state=State.ENDED, end_reason="cancelled")
    page = operator_client.get(QUEUE).content.decode()
    assert page.index("high") < page.index("low") < page.index("unranked")
    assert "finished" not in page
    assert "0.500 · 1.750 · 0.250" in page and "2.500" in page
    assert "not ranked yet" in page


def test_the_queue_shows_the_schedulers_estimate_reason_and_reservation(operator_client, pool, team, now):
    running_job(team=team, node=pool[0], gpus=2, now=now - timedelta(minutes=5))
    big = JobFactory(team=team, name="needs-all", gpus=8, hours=2.0, state=State.QUEUED, submitted_at=now)
    scheduler.run_pass(now=now)
    services.sample_utilisation(now=now)
    big.refresh_from_db()
    page = operator_client.get(QUEUE).content.decode()
    assert big.pending_reason and big.pending_reason in page
    assert big.estimated_start.strftime("%b %-d %H:%M") in page
    assert "gpu-01 (GPUs 0, 1, 2, 3); gpu-02 (GPUs 0, 1, 2, 3) from" in page


def test_the_queue_filters_by_team_size_and_state(operator_client, team, other_team):
    _waiting(team, name="small-vision", priority=1.0, gpus=1)
    _waiting(team, name="big-vision", priority=1.0, gpus=8)
    _waiting(other_team, name="small-audio", priority=1.0, gpus=1, state=State.STAGING)
    page = operator_client.get(QUEUE, {"team": "vision", "size": "1"}).content.decode()
    assert "small-vision" in page and "big-vision" not in page and "small-audio" not in page
    page = operator_client.get(QUEUE, {"state": "staging"}).content.decode()
    assert "small-audio" in page and "small-vision" not in page


def test_the_queue_rows_are_a_self_polling_fragment(operator_client, team):
    _waiting(team, name="one", priority=1.0)
    fragment = operator_client.get(QUEUE, {"team": "vision"}, **HTMX).content.decode()
    assert fragment.lstrip().startswith('<section id="queue-rows"')
    assert 'hx-get="/operator/queue/?team=vision"' in fragment and 'hx-trigger="every 5s"' in fragment
