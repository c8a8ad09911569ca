"""Ledger fixtures: allocations rented at chosen instants, released through the RELEASE service."""

from datetime import UTC, datetime

import pytest

from jobs import rental
from jobs.lifecycle import EndReason, State
from jobs.models import Allocation, Node
from metering.models import MeterEntry
from tests.factories import JobFactory, NodeFactory

T0 = datetime(2024, 3, 10, 9, 20, 15, 123456, tzinfo=UTC)


def rent(
    *,
    team,
    node: Node,
    at: datetime,
    gpus: int = 2,
    name: str = "train",
    gpu_indices: list[int] | None = None,
) -> Allocation:
    """A running job holding ``gpus`` GPUs of ``node`` since ``at`` (the rows RENT would write): GPUs no other
    allocation of these tests held, unless ``gpu_indices`` names them."""
    job = JobFactory(
        team=team, name=name, state=State.RUNNING, gpus=gpus, attempt=1, submitted_at=at, state_changed_at=at
    )
    if gpu_indices is None:
        first = sum(
            len(i) for i in Allocation.objects.filter(node=node).values_list("gpu_indices", flat=True)
        )
        gpu_indices = list(range(first, first + gpus))
    return Allocation.objects.create(
        job=job, attempt=1, node=node, gpu_indices=gpu_indices, rented_at=at, started_at=at
    )


def release(allocation: Allocation, *, at: datetime, reason: EndReason = EndReason.SUCCEEDED) -> None:
    """RELEASE through the jobs service, which closes the meter inside its transaction."""
    assert rental.release_job(job_id=allocation.job_id, end_reason=reason, now=at, actor="test")


def metered_micros(allocation: Allocation) -> int:
    rows = MeterEntry.objects.filter(allocation=allocation).exclude(kind="adjustment")
    return sum(rows.values_list("microseconds", flat=True))


@pytest.fixture
def node(db) -> Node:
    return NodeFactory(name="gpu-meter", gpus=8)
