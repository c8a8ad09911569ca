"""Beside the meter, how busy the GPUs were: the job page, the team ledger, and what the agent stores."""

from dataclasses import asdict
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from common import schema
from jobs import gpu_usage, gpus, nodes, selectors, tasks
from jobs.models import GpuMinute, GpuUseSummary, Node, NodeGpu
from tests.metering.conftest import release, rent

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 3, 10, tzinfo=UTC)


def _node(name: str, source: str) -> Node:
    found = gpus.virtual(4) if source == gpus.VIRTUAL else [
        gpus.Gpu(index=i, uuid=f"GPU-{name}-{i}", model="NVIDIA H100 80GB HBM3", memory_bytes=80 * 2**30)
        for i in range(4)
    ]  # fmt: skip
    return nodes.register_node(
        name=name, gpus=4, gpu_model=found[0].model, address="127.0.0.1", agent_version=schema.code().version, sandbox="bubblewrap",
        now=T0, gpu_list=[asdict(g) for g in found], gpu_source=source,
    )  # fmt: skip


def _minute(allocation, index: int, at: datetime, util: float, samples: int = 12) -> dict:
    return {"allocation_id": allocation.id, "gpu_index": index, "minute": at, "samples": samples,
            "utilisation_avg": util, "utilisation_max": util, "memory_used_max_bytes": 2**30,
            "power_avg_w": 250.0, "temperature_max_c": 60.0}  # fmt: skip


@pytest.fixture
def busy_job(team):
    """2 GPUs held 4 hours (8 GPU-hours): GPU 0 at 50 % for two sampled minutes, GPU 1 at 18 %."""
    allocation = rent(team=team, node=_node("gpu-real", "nvml"), at=T0, gpus=2, name="train")
    stored = gpu_usage.record_gpu_minutes(node_name="gpu-real", minutes=[
        _minute(allocation, 0, T0, 50), _minute(allocation, 0, T0 + timedelta(minutes=1), 50),
        _minute(allocation, 1, T0, 18, samples=24),
    ])  # fmt: skip
    assert stored == 3
    release(allocation, at=T0 + timedelta(hours=4))
    return allocation.job


def test_the_job_page_shows_the_gpu_hours_held_and_how_busy_those_gpus_were(member_client, busy_job):
    page = member_client.get(reverse("jobs:detail", args=[busy_job.id])).content.decode()
    # (50 x 12 + 50 x 12 + 18 x 24) / 48 samples = 34 %
    assert "Held 8.000 GPU-hours at 34 % average utilisation" in page
    assert "peak 50 %" in page


def test_a_job_on_virtual_gpus_says_there_are_no_metrics(member_client, team):
    allocation = rent(team=team, node=_node("local-1", gpus.VIRTUAL), at=T0, gpus=1, name="hello")
    release(allocation, at=T0 + timedelta(hours=1))
    page = member_client.get(reverse("jobs:detail", args=[allocation.job_id])).content.decode()
    assert "Held 1.000 GPU-hours · no metrics (virtual)" in page


def test_the_team_ledger_shows_each_jobs_average_utilisation(member_client, busy_job, team, time_machine):
    time_machine.move_to(T0 + timedelta(days=1), tick=False)
    virtual = rent(team=team, node=_node("local-1", gpus.VIRTUAL), at=T0, gpus=1, name="hello")
    release(virtual, at=T0 + timedelta(hours=1))
    page = member_client.get(reverse("metering:ledger"), {"month": "2026-11"}).content.decode()
    rows = {row.split("</a>")[0].split(">")[-1]: row for row in page.split("<tr>") if "#" in row}
    assert "34 %" in rows[f"#{busy_job.id} train"]
    assert "no metrics (virtual)" in rows[f"#{virtual.job_id} hello"]


def test_a_stored_minute_is_kept_and_an_agent_cannot_write_for_another_nodes_allocation(busy_job):
    allocation = busy_job.allocations.get()
    _node("gpu-other", "nvml")
    again = [_minute(allocation, 0, T0, 99)]
    gpu_usage.record_gpu_minutes(node_name="gpu-real", minutes=again)  # already stored: kept as it was
    assert (
        gpu_usage.record_gpu_minutes(
            node_name="gpu-other", minutes=[_minute(allocation, 1, T0 + timedelta(minutes=5), 1)]
        )
        == 0
    )
    assert GpuMinute.objects.filter(allocation=allocation).count() == 3
    assert GpuMinute.objects.get(allocation=allocation, gpu_index=0, minute=T0).utilisation_avg == 50


def test_each_gpus_latest_reading_is_what_the_pool_page_shows_live(operator_client):
    node = _node("gpu-real", "nvml")
    readings = [
        asdict(gpus.Sample(index=1, utilisation=73, memory_used_bytes=10**9, power_w=280, temperature_c=66))
    ]
    assert gpu_usage.record_gpu_readings(node_name="gpu-real", readings=readings, now=timezone.now()) == 1
    assert NodeGpu.objects.get(node=node, index=1).utilisation == 73
    row = (
        operator_client.get(reverse("operations:pool")).content.decode().split(f'id="node-{node.id}-row"')[1]
    )
    assert "utilisation 0: — · 1: 73 % · 2: — · 3: —" in row.split("</tr>")[0]


def _uses(job) -> list[dict]:
    allocations = list(job.allocations.select_related("node"))
    return [asdict(selectors.gpu_use_by_job([job.id])[job.id]),
            *map(asdict, selectors.gpu_use_by_allocation(allocations).values())]  # fmt: skip


@pytest.fixture
def with_a_late_minute(busy_job):
    """Two hours in, GPU 1 at 90 % for a minute whose power was not read: (1632 + 1080) / 60 samples = 45 %."""
    late = {**_minute(busy_job.allocations.get(), 1, T0 + timedelta(hours=2), 90), "power_avg_w": None}
    assert gpu_usage.record_gpu_minutes(node_name="gpu-real", minutes=[late]) == 1
    return busy_job


def test_gpu_minutes_past_their_days_go_and_the_job_page_shows_the_same_use(
    member_client, with_a_late_minute
):
    before = _uses(with_a_late_minute)
    pruned = gpu_usage.prune_gpu_minutes(now=T0 + timedelta(days=30, hours=1), keep_days=30)
    assert pruned == 3
    assert list(GpuMinute.objects.values_list("minute", flat=True)) == [T0 + timedelta(hours=2)]
    assert _uses(with_a_late_minute) == before  # the figures are whole sums here: exactly the same
    page = member_client.get(reverse("jobs:detail", args=[with_a_late_minute.id])).content.decode()
    assert "Held 8.000 GPU-hours at 45 % average utilisation" in page
    assert "peak 90 %" in page and "250 W on average" in page  # the minute without power is not a 0 W one


def test_pruning_in_small_batches_folds_each_minute_exactly_once(with_a_late_minute):
    before = _uses(with_a_late_minute)
    gone = T0 + timedelta(days=365)
    assert gpu_usage.prune_gpu_minutes(now=gone, keep_days=30, batch=1) == 4
    assert gpu_usage.prune_gpu_minutes(now=gone, keep_days=30, batch=1) == 0
    assert not GpuMinute.objects.exists()
    summary = GpuUseSummary.objects.get()
    assert (summary.minutes, summary.samples, summary.power_minutes) == (4, 60, 3)
    assert _uses(with_a_late_minute) == before


def test_beat_prunes_the_minutes_older_than_the_days_the_setting_keeps(busy_job, settings, time_machine):
    assert "jobs.tasks.prune_gpu_minutes" in {e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()}
    time_machine.move_to(T0 + timedelta(days=31), tick=False)
    settings.E31_GPU_MINUTES_KEEP_DAYS = 40
    tasks.prune_gpu_minutes()
    assert GpuMinute.objects.count() == 3
    settings.E31_GPU_MINUTES_KEEP_DAYS = 30
    tasks.prune_gpu_minutes()
    assert not GpuMinute.objects.exists()
    assert GpuUseSummary.objects.get().samples == 48
