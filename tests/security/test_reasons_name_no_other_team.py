"""Why a job waits is shown to its own team, through the list, the API and the submit form's estimate:
it never names another team, nor the id of another team's job."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs import scheduler
from tests.factories import JobFactory, TeamFactory

pytestmark = pytest.mark.django_db


def test_a_team_waiting_behind_another_teams_job_is_not_told_whose(team, other_team, outsider_client, pool):
    now = timezone.now()
    third = TeamFactory(name="third", slug="third")
    JobFactory(team=third, gpus=2, hours=10.0, submitted_at=now - timedelta(hours=3))
    scheduler.run_pass(now=now)  # the third team holds 2 GPUs: no 8-GPU job fits now
    ahead = JobFactory(team=team, name="vision-big", gpus=8, hours=5.0, submitted_at=now - timedelta(hours=2))
    waiting = JobFactory(
        team=other_team, name="audio-big", gpus=8, hours=5.0, submitted_at=now - timedelta(hours=1)
    )
    scheduler.run_pass(now=now + timedelta(seconds=1))
    waiting.refresh_from_db()
    assert waiting.state == "queued" and "another team" in waiting.pending_reason

    shown = {
        "api": outsider_client.get(f"/api/v1/jobs/{waiting.id}").json()["pending_reason"],
        "list": outsider_client.get(reverse("jobs:list")).content.decode(),
        "queue": outsider_client.get(reverse("jobs:queue")).content.decode(),
        "estimate": outsider_client.post(
            reverse("jobs:estimate"), {"request.gpus": "8", "request.hours": "5"}
        ).content.decode(),
    }
    for where, text in shown.items():
        assert not re.search(rf"\bjob #?{ahead.id}\b", text), where
        assert team.name not in text and third.name not in text, where
