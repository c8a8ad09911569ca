"""Operator dashboard fixtures: running jobs rented through the RENT service, samples, an htmx client."""

from datetime import UTC, datetime, timedelta

import pytest

from jobs import rental
from jobs.lifecycle import State
from jobs.models import Allocation, Job, Node
from operations import utilisation
from operations.models import TeamBusySample, UtilisationSample
from tests.factories import JobFactory

HTMX = {"HTTP_HX_REQUEST": "true"}


def running_job(*, team, node: Node, gpus: int = 2, requeue: bool = False, now: datetime, **fields) -> Job:
    """A job rented through jobs.rental.rent_job and started by its agent: it holds ``gpus`` GPUs of ``node``."""
    job = JobFactory(team=team, state=State.QUEUED, gpus=gpus, requeue=requeue, submitted_at=now, **fields)
    used = set(node.holds.filter(active=True).values_list("gpu_index", flat=True))
    indices = tuple(i for i in range(node.gpus) if i not in used)[:gpus]
    assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: indices}, now=now)
    allocation = Allocation.objects.get(job=job, released_at__isnull=True)
    assert rental.start_allocation(allocation_id=allocation.id, now=now)
    job.refresh_from_db()
    return job


def store_samples(*, start: datetime, minutes: int, total: int, busy: int, team_busy: dict[int, int]) -> None:
    """``minutes`` consecutive samples from ``start`` with the same figures (bulk-created)."""
    first = utilisation.minute_of(start)
    samples = UtilisationSample.objects.bulk_create(
        UtilisationSample(
            minute=m, at=utilisation.at_minute(m), total_gpus=total, busy_gpus=busy, reserved_gpus=0,
            idle_while_waiting_gpus=total - busy, queued_jobs=1,
        )
        for m in range(first, first + minutes)
    )  # fmt: skip
    TeamBusySample.objects.bulk_create(
        TeamBusySample(sample=s, minute=s.minute, team_id=team_id, busy_gpus=gpus)
        for s in samples
        for team_id, gpus in team_busy.items()
    )


@pytest.fixture
def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
def an_hour_ago(now) -> datetime:
    return now - timedelta(hours=1)
