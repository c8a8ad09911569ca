"""A real agent on a node whose GPUs only nvidia-smi knows (NVML cannot load here): a stand-in nvidia-smi on
its PATH answers from a file the test edits, to take a GPU off the bus or make the GPUs busy."""

import os

import pytest
from django.utils import timezone

from jobs import nodes
from jobs.models import Allocation, Node, NodeGpu
from tests.e2e.conftest import wait_for, wait_for_state
from tests.e2e.test_lifecycle_e2e import py, submit
from tests.fakes import FAKE_BIN, h100, write_gpus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture
def gpu_node(live_pool, tmp_path):
    """A third agent started as on a GPU machine (no --gpus, no --virtual-gpus), the only node taking work."""
    gpus_file = write_gpus(tmp_path / "gpus.json", [h100(i, util=20 * i) for i in range(4)])
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
