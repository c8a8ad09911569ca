"""Each GPU a node registers is a row; a GPU that goes missing is never placed on again, and the job on it is lost."""

from dataclasses import asdict
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from common import schema
from jobs import gpus, nodes, rental, scheduler
from jobs.models import Allocation, GpuHold, Job, Node, NodeGpu
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def _gpu(index: int) -> dict:
    return asdict(gpus.Gpu(index=index, uuid=f"GPU-{index}", model="NVIDIA H100 80GB HBM3",
                           memory_bytes=80 * 2**30, driver_version="550.54.15", cuda_version="12.4"))  # fmt: skip


def _register(name: str, indices) -> Node:
    return nodes.register_node(
        name=name, gpus=len(indices), gpu_model="NVIDIA H100 80GB HBM3", address="127.0.0.1", agent_version=schema.code().version,
        sandbox="bubblewrap", now=timezone.now(), gpu_list=[_gpu(i) for i in indices], gpu_source="nvml",
    )  # fmt: skip


def test_registration_records_each_gpu_with_its_uuid_model_memory_and_versions():
    node = _register("gpu-a", [0, 1, 2, 3])
    rows = list(
        NodeGpu.objects.filter(node=node).values_list(
            "index", "uuid", "memory_bytes", "cuda_version", "present"
        )
    )
    assert rows == [(i, f"GPU-{i}", 80 * 2**30, "12.4", True) for i in range(4)]
    assert (node.gpus, node.gpu_source) == (4, "nvml")


def test_a_gpu_that_falls_off_the_bus_is_kept_as_missing_and_its_job_is_lost_and_requeued():
    node = _register("gpu-a", [0, 1, 2, 3])
    on_missing, on_other = JobFactory(gpus=1, requeue=True), JobFactory(gpus=1, requeue=False)
    now = timezone.now()
    assert rental.rent_job(job_id=on_missing.id, gpus_by_node={"gpu-a": (2,)}, now=now)
    assert rental.rent_job(job_id=on_other.id, gpus_by_node={"gpu-a": (0,)}, now=now)
    for job in (
        on_missing,
        on_other,
    ):  # running: a part lost before its start spends no attempt (NOT_STARTED)
        assert rental.start_allocation(allocation_id=Allocation.objects.get(job=job).id, now=now)
    missing = nodes.update_node_gpus(
        name="gpu-a", gpu_list=[_gpu(i) for i in (0, 1, 3)], now=now + timedelta(seconds=5)
    )
    assert missing == [2]
    node.refresh_from_db()
    assert node.gpus == 3
    assert list(NodeGpu.objects.filter(node=node, present=False).values_list("index", flat=True)) == [2]
    on_missing.refresh_from_db()
    assert on_missing.state == "queued" and on_missing.events.last().reason.startswith("requeued")
    assert "GPU 2 of gpu-a is gone" in on_missing.events.last().reason
    assert Allocation.objects.get(job=on_other).released_at is None  # the job on a GPU still there runs on


def test_the_scheduler_never_places_on_a_missing_gpu():
    _register("gpu-a", [0, 1, 2, 3])
    nodes.update_node_gpus(name="gpu-a", gpu_list=[_gpu(i) for i in (0, 1, 3)], now=timezone.now())
    team = JobFactory().team
    Job.objects.all().delete()
    jobs = [JobFactory(team=team, gpus=1) for _ in range(4)]
    scheduler.run_pass(now=timezone.now())
    assert sorted(GpuHold.objects.filter(active=True).values_list("gpu_index", flat=True)) == [0, 1, 3]
    assert sum(Job.objects.get(id=j.id).state == "queued" for j in jobs) == 1


def test_rent_refuses_a_gpu_that_went_missing_after_the_pass_read_the_pool():
    _register("gpu-a", [0, 1, 2, 3])
    nodes.update_node_gpus(name="gpu-a", gpu_list=[_gpu(i) for i in (0, 1, 3)], now=timezone.now())
    job = JobFactory(gpus=1)
    assert not rental.rent_job(job_id=job.id, gpus_by_node={"gpu-a": (2,)}, now=timezone.now())
    assert rental.rent_job(job_id=job.id, gpus_by_node={"gpu-a": (3,)}, now=timezone.now())


def test_a_gpu_back_on_the_bus_is_offered_again():
    node = _register("gpu-a", [0, 1])
    nodes.update_node_gpus(name="gpu-a", gpu_list=[_gpu(0)], now=timezone.now())
    assert nodes.update_node_gpus(name="gpu-a", gpu_list=[_gpu(0), _gpu(1)], now=timezone.now()) == []
    assert NodeGpu.objects.filter(node=node, present=True).count() == 2
    node.refresh_from_db()
    assert node.gpus == 2


def test_the_pool_page_labels_virtual_gpus_and_shows_a_missing_gpu_and_each_gpus_live_utilisation(
    operator_client,
):
    local = nodes.register_node(name="local-v", gpus=2, gpu_model="virtual", address="127.0.0.1", agent_version=schema.code().version,
                        sandbox="none", now=timezone.now(), gpu_list=[asdict(g) for g in gpus.virtual(2)],
                        gpu_source="virtual")  # fmt: skip
    node = _register("gpu-a", [0, 1, 2])
    nodes.update_node_gpus(name="gpu-a", gpu_list=[_gpu(0), _gpu(2)], now=timezone.now())
    NodeGpu.objects.filter(node=node, index=2).update(
        utilisation=87, memory_used_bytes=40 * 10**9, power_w=312, temperature_c=64, sampled_at=timezone.now()
    )
    page = operator_client.get(reverse("operations:pool")).content.decode()
    virtual_row = page.split(f'id="node-{local.id}-row"')[1].split("</tr>")[0]
    assert "virtual</span>" in virtual_row and "no metrics (virtual)" in virtual_row
    real_row = page.split(f'id="node-{node.id}-row"')[1].split("</tr>")[0]
    assert "utilisation 0: — · 2: 87 % (from nvml)" in real_row  # GPU 0 has no sample yet
    assert "GPU 1 missing since" in real_row
    assert 'title="GPU 2 · GPU-2 · 87 % busy · 40.0 GB used · 312 W · 64 °C · free"' in real_row
    assert 'title="GPU 1 · missing · GPU-1"' in real_row
    assert "no metrics" not in real_row
