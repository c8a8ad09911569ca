"""Slightly more: an elastic job may declare max_gpus and start wider when GPUs would otherwise idle."""

from decimal import Decimal
from types import SimpleNamespace

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs import agent
from jobs.models import Allocation, Job
from tests.factories import JobFactory, NodeFactory
from tests.jobs.intake_channels import error_fields, submit_api, submit_file, submit_form

pytestmark = pytest.mark.django_db


@pytest.fixture
def good(roots):
    _, out_root = roots
    return {
        "name": "wide",
        "work": {"argv": ["python3", "train.py"]},
        "request": {"gpus": 2, "hours": 1.0, "max_gpus": 6},
        "output": {"uri": f"file://{out_root}/wide", "bytes": 1000},
    }


@pytest.mark.parametrize("channel", ["form", "file", "api"])
def test_max_gpus_is_stored_through_every_channel(channel, good, pool, member_client, member_token):
    response = {
        "form": lambda: submit_form(member_client, good),
        "file": lambda: submit_file(member_client, good),
        "api": lambda: submit_api(member_client, good, member_token),
    }[channel]()
    assert response.status_code in (201, 302), response.content[:500]
    assert Job.objects.get().max_gpus == 6


@pytest.mark.parametrize("value", [1, 9, True, "4"])
def test_max_gpus_below_the_request_past_the_pool_or_not_a_number_is_refused(
    value, good, pool, member_client, member_token
):
    good["request"]["max_gpus"] = value
    response = submit_api(member_client, good, member_token)
    assert response.status_code == 422 and "request.max_gpus" in error_fields(response)
    assert not Job.objects.exists()


def test_the_api_shows_max_gpus(good, pool, member_client, member_token):
    job_id = submit_api(member_client, good, member_token).json()["id"]
    shown = member_client.get(f"/api/v1/jobs/{job_id}", HTTP_AUTHORIZATION=f"Bearer {member_token}").json()
    assert shown["request"]["max_gpus"] == 6


def test_a_job_reads_how_many_gpus_its_attempt_holds(team):
    a, b = NodeFactory(name="gpu-a", gpus=4), NodeFactory(name="gpu-b", gpus=4)
    job = JobFactory(team=team, state="running", gpus=2, max_gpus=8, attempt=1)
    now = timezone.now()
    first = Allocation.objects.create(
        job=job, attempt=1, node=a, rank=0, gpu_indices=[0, 1, 2, 3], rented_at=now
    )
    Allocation.objects.create(job=job, attempt=1, node=b, rank=1, gpu_indices=[0, 1, 2], rented_at=now)
    part = agent._load_part(first.id, "none", None)
    env = agent._job_env(part, SimpleNamespace(work="/w", data="/d", output="/o", checkpoint=None), None)
    assert env["E31_NUM_GPUS"] == "7"


def test_the_form_says_a_draft_would_start_wider_on_idle_gpus(pool, member_client):
    fields = {"request.gpus": "2", "request.hours": "1", "request.max_gpus": "6"}
    html = member_client.post(reverse("jobs:estimate"), fields).content.decode()
    assert "it would start with 4 GPUs (elastic, up to 6)" in html


def test_the_form_says_how_far_an_enforced_budget_lets_a_draft_start_wider(team, pool, member_client):
    team.monthly_budget_gpu_hours, team.budget_enforced = Decimal("3"), True  # 2 x 1 h, and room for 1 more
    team.save()
    fields = {"request.gpus": "2", "request.hours": "1", "request.max_gpus": "6"}
    html = member_client.post(reverse("jobs:estimate"), fields).content.decode()
    assert (
        "it would start with 3 GPUs (elastic, up to 6; the team&#x27;s enforced budget has room for no more)"
        in html
    )
