"""GPUs held for a job whose process the platform never ran: metered as held, credited by the platform at once.

Before, the team paid for them until an operator noticed and added an adjustment: a GPU still in use by a
stopping process on its node, a node disk with no room for the attempt's space, an agent that never took the
start message (five minutes of every GPU of the part, rung again and again)."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from jobs import rental
from jobs.lifecycle import State
from jobs.models import Allocation, Job, TeamUsage
from metering import reports, services
from metering.models import MeterEntry
from tests.factories import JobFactory
from tests.metering.conftest import metered_micros

pytestmark = pytest.mark.django_db
SECOND = 1_000_000


def _credits(allocation: Allocation) -> list[tuple[datetime, datetime, int, str]]:
    rows = MeterEntry.objects.filter(allocation=allocation, kind="adjustment", created_by__isnull=True)
    return list(
        rows.order_by("period_start").values_list("period_start", "period_end", "microseconds", "reason")
    )


@pytest.mark.parametrize(
    ("end_reason", "says"),
    [
        (rental.GPU_BUSY, "a GPU was still in use by a process that was stopping"),
        (rental.NO_ROOM, "no room on the node for the attempt's space"),
    ],
)
def test_a_part_whose_process_the_agent_could_not_start_is_credited_hour_by_hour(
    pool, team, end_reason, says
):
    """A 2-GPU part rented at 09:59:30 is released 45 s later, across an hour, before its process ran."""
    rented = datetime(2026, 3, 2, 9, 59, 30, tzinfo=UTC)
    job = JobFactory(team=team, gpus=2, hours=1.0)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0, 1)}, now=rented)
    allocation = Allocation.objects.get(job=job)
    assert rental.start_allocation(allocation_id=allocation.id, now=rented + timedelta(seconds=1))
    released = rented + timedelta(seconds=45)
    assert rental.release_part(
        allocation_id=allocation.id, end_reason=end_reason, now=released, actor="agent"
    )

    assert metered_micros(allocation) == 45 * SECOND  # held, and the ledger says so
    ten = datetime(2026, 3, 2, 10, tzinfo=UTC)
    reason = f"credited by the platform: the job's process never ran ({says})"
    assert _credits(allocation) == [
        (rented, ten, -30 * SECOND, reason),
        (ten, released, -15 * SECOND, reason),
    ]
    assert reports.statement(team=team, month=datetime(2026, 3, 1, tzinfo=UTC)).gpu_micros == 0
    assert Job.objects.get(id=job.id).state == State.QUEUED
    assert not TeamUsage.objects.filter(
        team=team, gpu_seconds__gt=0
    ).exists()  # nor counted in its fair share
    assert services.find_violations(now=released + timedelta(hours=2)) == []


def test_a_part_cancelled_by_its_team_before_its_process_ran_is_not_credited(pool, team, member):
    """The team's own choice: the GPUs it held until it cancelled are its own."""
    rented = timezone.now() - timedelta(seconds=30)
    job = JobFactory(team=team, submitted_by=member)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=rented)
    assert rental.release_job(job_id=job.id, end_reason="cancelled", now=timezone.now(), actor="test")
    assert _credits(Allocation.objects.get(job=job)) == []


def test_the_ledger_refuses_a_charge_nobody_signed_and_a_second_platform_credit_of_an_hour(pool, team):
    rented = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    job = JobFactory(team=team)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=rented)
    allocation = Allocation.objects.get(job=job)
    row = dict(allocation=allocation, job=job, team=team, period_start=rented, gpus=1, kind="adjustment",
               period_end=rented + timedelta(seconds=5), reason="platform", created_at=rented)  # fmt: skip
    with pytest.raises(IntegrityError), transaction.atomic():
        MeterEntry.objects.create(microseconds=5 * SECOND, **row)  # a charge: only an operator signs one
    MeterEntry.objects.create(microseconds=-5 * SECOND, **row)
    with pytest.raises(IntegrityError), transaction.atomic():
        MeterEntry.objects.create(microseconds=-5 * SECOND, **row)


def test_what_an_operator_credited_already_is_not_credited_again(pool, team, operator):
    """A part held with nothing running: an operator credits its first hour, then the reconciler gives up on it.
    The platform credited the whole held time again: the allocation's total went to -1 GPU-hour and
    check_ledger reported "adjustments credit more GPU-time than was metered"."""
    rented = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    job = JobFactory(team=team)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-01": (0,)}, now=rented)
    allocation = Allocation.objects.get(job=job)
    services.accrue_meter(now=rented + timedelta(hours=2, minutes=5))
    services.adjust_meter(
        allocation_id=allocation.id, microseconds=-3600 * SECOND, reason="held with nothing running",
        author=operator, now=rented + timedelta(hours=2, minutes=6),
    )  # fmt: skip
    released = rented + timedelta(hours=2, minutes=10)
    assert rental.release_unstarted(allocation_id=allocation.id, now=released, detail="deaf agent")

    total = sum(MeterEntry.objects.filter(allocation=allocation).values_list("microseconds", flat=True))
    assert total == 0
    assert sum(us for *_, us, _ in _credits(allocation)) == -70 * 60 * SECOND  # what was left, no more
    assert services.find_violations(now=released + timedelta(hours=1)) == []
