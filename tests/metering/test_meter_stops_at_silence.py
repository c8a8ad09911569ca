"""A node that fell silent is billed up to when it would have been declared lost, not to when anyone noticed.

The reaper declares a node down E31_NODE_TIMEOUT_S after its last beat. When nothing ran the reaper meanwhile
(the embedded console stopped with its node agent, or the platform's beat down for hours), the agent's next
registration, or the next reap, found the attempt and released it at that moment: the whole outage was metered
as held GPU-time although nothing had run since the node's last beat.
"""

from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from django.db.models import F, Sum

from common import schema
from jobs import nodes, rental
from jobs.models import Allocation, Job, Node
from metering import services as metering
from metering.models import MeterEntry
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


def _running(team, node) -> Job:
    job = JobFactory(team=team, state="queued", gpus=2, requeue=True)
    assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: (0, 1)}, now=T0)
    [part] = Allocation.objects.filter(job=job)
    assert rental.start_allocation(allocation_id=part.id, now=T0)
    return job


def _last_beat(node, at) -> datetime:
    Node.objects.filter(id=node.id).update(last_heartbeat=at)
    return at


def _gpu_seconds(job) -> float:
    held = MeterEntry.objects.filter(job=job).aggregate(total=Sum(F("gpus") * F("microseconds")))["total"]
    return held / 1e6


def test_an_agent_registering_after_a_long_outage_bills_only_up_to_the_silence_timeout(team):
    node = NodeFactory(name="gpu-05", gpus=2)
    job = _running(team, node)
    beat = _last_beat(node, T0 + timedelta(minutes=5))

    nodes.register_node(
        name="gpu-05", gpus=2, gpu_model="", address="", agent_version=schema.code().version,
        sandbox="bubblewrap", now=T0 + timedelta(hours=10),
    )  # fmt: skip

    lost_at = beat + timedelta(seconds=settings.E31_NODE_TIMEOUT_S)
    assert Allocation.objects.get(job=job).released_at == lost_at
    assert _gpu_seconds(job) == 2 * (lost_at - T0).total_seconds()  # not 2 x 10 hours
    assert Job.objects.get(id=job.id).state == "queued"  # requeued, as it asked


def test_the_hourly_accrual_after_an_outage_bills_a_silent_node_only_up_to_its_timeout(team):
    """Beat was down too: the first accrual back reaps the silent node first, instead of closing every hour of
    the outage as held."""
    node = NodeFactory(name="gpu-06", gpus=2)
    job = _running(team, node)
    beat = _last_beat(node, T0 + timedelta(minutes=5))

    metering.accrue_meter(now=T0 + timedelta(hours=10))

    lost_at = beat + timedelta(seconds=settings.E31_NODE_TIMEOUT_S)
    assert Allocation.objects.get(job=job).released_at == lost_at
    assert _gpu_seconds(job) == 2 * (lost_at - T0).total_seconds()
    assert Node.objects.get(id=node.id).state == Node.NodeState.DOWN


def test_a_node_reaped_on_time_is_released_when_it_is_reaped(team):
    """The usual case: the reaper runs every few seconds, so the release is at most the timeout after the beat."""
    node = NodeFactory(name="gpu-07", gpus=2)
    job = _running(team, node)
    beat = _last_beat(node, T0 + timedelta(minutes=5))
    reaped = beat + timedelta(seconds=settings.E31_NODE_TIMEOUT_S + 3)

    assert nodes.reap_silent_nodes(now=reaped) == ["gpu-07"]

    released = Allocation.objects.get(job=job).released_at
    assert beat < released <= reaped


def test_only_the_lost_part_is_dated_back_its_job_and_other_parts_change_now(team):
    """A job spanning two nodes: gpu-08 fell silent at 09:05, gpu-09's part finished at 10:00 and waits for its
    sibling, and gpu-08 is found lost at 11:00. Only gpu-08's part ends at its silence; gpu-09's held its GPUs
    until now, and the job's requeue is recorded now, after every event before it."""
    lost = NodeFactory(name="gpu-08", gpus=1)
    NodeFactory(name="gpu-09", gpus=1)
    job = JobFactory(team=team, state="queued", gpus=2, requeue=True)
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-08": (0,), "gpu-09": (0,)}, now=T0)
    parts = {p.node.name: p for p in Allocation.objects.filter(job=job).select_related("node")}
    for part in parts.values():
        assert rental.start_allocation(allocation_id=part.id, now=T0)
    finished = T0 + timedelta(hours=1)
    Allocation.objects.filter(id=parts["gpu-09"].id).update(finished_at=finished, exit_code=0)
    beat = _last_beat(lost, T0 + timedelta(minutes=5))
    found = T0 + timedelta(hours=2)

    rental.lose_node_allocations(node=Node.objects.get(id=lost.id), now=found, detail="silent")

    released = dict(Allocation.objects.filter(job=job).values_list("node__name", "released_at"))
    assert released == {"gpu-08": beat + timedelta(seconds=settings.E31_NODE_TIMEOUT_S), "gpu-09": found}
    job.refresh_from_db()
    assert (job.state, job.state_changed_at) == ("queued", found)
