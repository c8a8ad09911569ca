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
