"""Counts read as English: one GPU, one node, one GPU-hour, never "1 GPUs" or "GPUs 0" for a GPU index."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs.models import Allocation
from metering import services as metering
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db

WRONG = re.compile(r"(?<![\d.,])1 (GPUs|nodes|GPU-hours|jobs|files|lines|allocations)\b|\bGPUs 0\b")


@pytest.fixture
def one_of_everything(team):
    """One single-GPU node running one single-GPU job for an hour, against a budget of one GPU-hour."""
    team.monthly_budget_gpu_hours = 1
    team.save()
    node = NodeFactory(name="local-1", gpus=1)
    start = timezone.now() - timedelta(hours=1, minutes=5)
    job = JobFactory(team=team, name="one", state="running", gpus=1, attempt=1, submitted_at=start)
    Allocation.objects.create(
        job=job, attempt=1, node=node, gpu_indices=[0], rented_at=start, started_at=start
    )
    JobFactory(team=team, name="waiting", state="queued", gpus=1, pending_reason="needs 1 GPU on one node")
    metering.accrue_meter(now=timezone.now())
    return job, node


def _pages(team, job, node) -> list[str]:
    return [
        reverse("jobs:list"), reverse("jobs:detail", args=[job.id]), reverse("jobs:queue"),
        reverse("metering:ledger"), reverse("operations:pool"), reverse("operations:teams"),
        reverse("operations:team", args=[team.slug]), reverse("operations:jobs"),
        reverse("operations:job-action", args=[job.id, "cancel"]),
        reverse("operations:node-action", args=[node.name, "drain"]), reverse("operations:queue"),
    ]  # fmt: skip


def test_no_page_says_one_in_the_plural_or_reads_a_gpu_index_as_a_count(
    one_of_everything, team, operator_client
):
    job, node = one_of_everything
    found = {}
    for url in _pages(team, job, node):
        response = operator_client.get(url)
        assert response.status_code == 200, url
        text = re.sub(r"<[^>]+>", " ", response.content.decode())
        text = re.sub(r"\s+", " ", text)
        if wrong := sorted({m.group(0) for m in WRONG.finditer(text)}):
            found[url] = wrong
    assert not found, "\n".join(f"{u}: {w}" for u, w in found.items())


def test_the_budget_sentence_counts_one_gpu_hour_in_the_singular(team):
    from metering import selectors

    team.monthly_budget_gpu_hours = 1
    projection = selectors.projection(team=team, extra_gpu_hours=1.0, now=timezone.now())
    assert "to 1 of 1 GPU-hour this month" in projection.message
    team.monthly_budget_gpu_hours = None
    projection = selectors.projection(team=team, extra_gpu_hours=1.0, now=timezone.now())
    assert "to 1 GPU-hour this month" in projection.message
