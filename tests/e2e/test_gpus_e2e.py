"""A real agent on a node whose GPUs only nvidia-smi knows (NVML cannot load here): a stand-in nvidia-smi on
its PATH answers from a file the test edits, to take a GPU off the bus or make the GPUs busy."""

import os

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs import nodes
from jobs.models import Allocation, GpuMinute, Node, NodeGpu
from tests.e2e.conftest import wait_for, wait_for_state
from tests.e2e.test_lifecycle_e2e import py, submit
from tests.factories import UserFactory
from tests.fakes import FAKE_BIN, h100, write_gpus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
UTIL = [10, 30, 50, 70]  # each GPU's utilisation, as the stand-in nvidia-smi reports it


@pytest.fixture
def gpu_node(live_pool, tmp_path):
    """A third agent started as on a GPU machine (no --gpus, no --virtual-gpus), the only node taking work."""
    gpus_file = write_gpus(tmp_path / "gpus.json", [h100(i, util=UTIL[i]) for i in range(4)])
    name = f"e2e-{live_pool.tag}-3"  # a pool's third agent
    env = {"PATH": f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}", "E31_FAKE_GPUS": str(gpus_file),
           "E31_GPU_RESCAN_S": "1", "E31_GPU_SAMPLE_S": "0.5"}  # fmt: skip
    live_pool.start_agent(name, gpu_args=[], env=env)
    for virtual in live_pool.nodes[:2]:
        nodes.set_node_state(name=virtual, target=Node.NodeState.DRAINING, now=timezone.now(), actor="test")
    wait_for(
        lambda: Node.objects.filter(name=name, state="up").exists(),
        timeout=90,
        what="the GPU node to register",
    )
    return name, gpus_file


def test_the_agent_registers_the_gpus_nvidia_smi_reports_and_stops_offering_one_that_falls_off(
    gpu_node, member
):
    name, gpus_file = gpu_node
    node = Node.objects.get(name=name)
    assert (node.gpus, node.gpu_model, node.gpu_source) == (4, "NVIDIA H100 80GB HBM3", "nvidia-smi")
    listed = list(NodeGpu.objects.filter(node=node).values_list("index", "uuid", "cuda_version", "virtual"))
    assert listed == [(i, h100(i)["uuid"], "12.4", False) for i in range(4)]

    write_gpus(gpus_file, [h100(i) for i in (0, 2, 3)])  # GPU 1 falls off the bus
    wait_for(lambda: NodeGpu.objects.filter(node=node, index=1, present=False).exists(), timeout=30,
             what="the agent to register its GPU set again")  # fmt: skip
    assert Node.objects.get(name=name).gpus == 3

    job = submit(member, py("import os; print('visible', os.environ['CUDA_VISIBLE_DEVICES'])"), gpus=3)
    job = wait_for_state(job.id, "released", timeout=60)
    assert job.end_reason == "succeeded", job.log_tail
    assert Allocation.objects.get(job=job).gpu_indices == [0, 2, 3]
    # CUDA names them by UUID: right whatever the renumbering once GPU 1 is gone
    assert f"visible {h100(0)['uuid']},{h100(2)['uuid']},{h100(3)['uuid']}" in job.log_tail


def test_the_agent_samples_the_gpus_a_job_holds_and_the_job_page_shows_how_busy_they_were(
    live_pool, gpu_node, member, client
):
    name, gpus_file = gpu_node
    # nvidia-smi answering slower than the node timeout (3 s here) must never cost the node its heartbeat
    write_gpus(gpus_file, [h100(i, util=UTIL[i]) for i in range(4)], delay_s=4)
    job = submit(member, py("import time; time.sleep(15)"), gpus=2)  # a few samples, each taking 4 s
    job = wait_for_state(job.id, "released", timeout=60)
    assert job.end_reason == "succeeded", (
        job.end_reason,
        job.log_tail,
        list(job.events.values_list("reason", flat=True)),
    )
    allocation = Allocation.objects.get(job=job)
    try:
        minutes = wait_for(
            lambda: list(GpuMinute.objects.filter(allocation=allocation).order_by("gpu_index")) or None,
            timeout=30, what="the agent to store the job's minute summaries",
        )  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the agent's log ends:\n{live_pool.log(name)[-4000:]}") from None
    assert {m.gpu_index for m in minutes} == set(allocation.gpu_indices)
    for m in minutes:  # one row per GPU per UTC minute: two if the job ran across a minute's end
        assert (m.utilisation_avg, m.power_avg_w, m.temperature_max_c) == (UTIL[m.gpu_index], 70.0, 35.0)
    for index in allocation.gpu_indices:
        assert sum(m.samples for m in minutes if m.gpu_index == index) >= 1
    expected = sum(UTIL[i] * n for i, n in ((m.gpu_index, m.samples) for m in minutes)) / sum(
        m.samples for m in minutes
    )
    client.force_login(member)
    page = client.get(reverse("jobs:detail", args=[job.id])).content.decode()
    assert f"GPU-hours at {expected:.0f} % average utilisation" in page

    # the operator's pool page shows each GPU's live utilisation, idle ones included
    node = Node.objects.get(name=name)
    wait_for(lambda: NodeGpu.objects.filter(node=node, sampled_at__isnull=False).count() == 4, timeout=10,
             what="every GPU's latest reading")  # fmt: skip
    client.force_login(UserFactory(username="olga", is_staff=True))
    row = client.get(reverse("operations:pool")).content.decode().split(f'id="node-{node.id}-row"')[1]
    assert "utilisation 0: 10 % · 1: 30 % · 2: 50 % · 3: 70 % (from nvidia-smi)" in row.split("</tr>")[0]
