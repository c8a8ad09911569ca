"""An elastic job starts wider only as far as its team's enforced budget allows.

The submission weighed the job at its requested GPUs x hours; a start on idle GPUs past that
would spend hours the budget never allowed, so RENT trims the widening to what is left.
"""

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from jobs import rental
from jobs.lifecycle import State
from jobs.models import Allocation, Job, JobEvent
from metering import selectors
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db

NOW = datetime(2024, 5, 20, 12, 0, tzinfo=UTC)
EIGHT_GPUS = {"gpu-meter": (0, 1, 2, 3, 4, 5, 6, 7)}


def _elastic(team, *, budget: str | None, enforced: bool) -> Job:
    team.monthly_budget_gpu_hours = None if budget is None else Decimal(budget)
    team.budget_enforced = enforced
    team.save()
    return JobFactory(team=team, state=State.QUEUED, gpus=2, max_gpus=8, hours=10.0)


def _held(job: Job) -> list[int]:
    return Allocation.objects.get(job=job).gpu_indices


def test_a_widened_start_keeps_only_the_gpus_an_enforced_budget_leaves_room_for(team, node):
    job = _elastic(team, budget="40", enforced=True)  # 2 x 10 h weighed at submission: 20 left, 2 more GPUs

    assert rental.rent_job(job_id=job.id, gpus_by_node=EIGHT_GPUS, now=NOW, reason="placed")

    assert _held(job) == [0, 1, 2, 3]
    projection = selectors.projection(team=team, extra_gpu_hours=0.0, now=NOW)
    assert projection.total_gpu_hours == pytest.approx(40.0)
    assert not projection.would_exceed
    rented = JobEvent.objects.get(job=job, to_state=State.RENTED)
    assert rented.reason == (
        "placed on gpu-meter (GPUs 0, 1, 2, 3) (elastic: 4 GPUs for 2 requested, up to 8; "
        "no wider: vision's enforced monthly budget leaves room for 2 more GPUs over the job's 10 h)"
    )


def test_an_enforced_budget_already_spent_keeps_the_requested_gpus_only(team, node):
    job = _elastic(team, budget="15", enforced=True)  # over already (budget lowered after submission)

    assert rental.rent_job(job_id=job.id, gpus_by_node=EIGHT_GPUS, now=NOW, reason="placed")

    assert _held(job) == [0, 1]


@pytest.mark.parametrize(("budget", "enforced"), [(None, False), ("40", False), ("1000", True)])
def test_without_an_enforced_limit_in_the_way_the_start_stays_as_wide_as_placed(team, node, budget, enforced):
    job = _elastic(team, budget=budget, enforced=enforced)

    assert rental.rent_job(job_id=job.id, gpus_by_node=EIGHT_GPUS, now=NOW, reason="placed")

    assert _held(job) == list(range(8))


def test_a_widened_start_over_two_nodes_keeps_a_gpu_on_each(team, node):
    NodeFactory(name="gpu-meter-b", gpus=8)
    job = _elastic(team, budget="40", enforced=True)
    placed = {"gpu-meter": (0, 1, 2, 3, 4), "gpu-meter-b": (0, 1, 2)}

    assert rental.rent_job(job_id=job.id, gpus_by_node=placed, now=NOW, reason="placed")

    parts = {a.node.name: a.gpu_indices for a in Allocation.objects.filter(job=job)}
    assert sum(map(len, parts.values())) == 4
    assert set(parts) == {"gpu-meter", "gpu-meter-b"} and all(parts.values())
