"""A node's name belongs to one machine while its agent beats: a second machine started under the same name (a
copied configuration) is refused, rather than taking the node over and losing the jobs running on the first."""

from datetime import timedelta

import pytest
from django.utils import timezone

from common import schema
from jobs import nodes, rental
from jobs.management.commands import node_agent
from jobs.models import Allocation, Node
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def _register(name: str, *, host: str, gpus: int = 2, gpu_list=None, now=None) -> Node:
    listed = [{"index": i, "uuid": f"GPU-{host}-{i}"} for i in range(gpus)] if gpu_list is None else gpu_list
    return nodes.register_node(
        name=name, gpus=gpus, gpu_model="virtual", address=f"{host}.example", agent_version=schema.code().version,
        sandbox="bubblewrap", now=now or timezone.now(), gpu_list=listed, host_id=host,
    )  # fmt: skip


def _running_job_on(name: str):
    job = JobFactory(gpus=1)
    assert rental.rent_job(job_id=job.id, gpus_by_node={name: (0,)}, now=timezone.now())
    part = Allocation.objects.get(job=job)
    assert rental.start_allocation(allocation_id=part.id, now=timezone.now())
    return part


def test_a_second_machine_under_a_beating_nodes_name_is_refused_and_the_nodes_jobs_run_on():
    _register("gpu-07", host="machine-a")
    part = _running_job_on("gpu-07")

    with pytest.raises(nodes.NodeNameTaken) as refused:
        _register("gpu-07", host="machine-b", gpus=8)

    assert "gpu-07" in str(refused.value) and "another machine" in str(refused.value)
    part.refresh_from_db()
    node = Node.objects.get(name="gpu-07")
    assert part.released_at is None
    assert (node.host_id, node.gpus, node.address) == ("machine-a", 2, "machine-a.example")


def test_the_same_machine_restarting_its_agent_registers_again_and_its_old_attempts_are_lost():
    _register("gpu-07", host="machine-a")
    part = _running_job_on("gpu-07")

    _register("gpu-07", host="machine-a")

    part.refresh_from_db()
    assert part.released_at is not None and part.end_reason == "node_lost"


def test_another_machine_takes_a_name_over_once_its_node_was_declared_down():
    then = timezone.now() - timedelta(hours=1)
    _register("gpu-07", host="machine-a", now=then)
    Node.objects.filter(name="gpu-07").update(last_heartbeat=then)
    nodes.reap_silent_nodes(now=timezone.now())

    node = _register("gpu-07", host="machine-b")

    assert (node.host_id, node.state) == ("machine-b", Node.NodeState.UP)


def test_the_first_machines_beat_stops_counting_once_another_took_its_name_over():
    """Machine A was cut off long enough to be declared down, machine B took the name: A's beats, when it is back,
    no longer keep B's node alive, and A's agent learns it must not serve the node's queue."""
    then = timezone.now() - timedelta(hours=1)
    _register("gpu-07", host="machine-a", now=then)
    Node.objects.filter(name="gpu-07").update(last_heartbeat=then)
    nodes.reap_silent_nodes(now=timezone.now())
    _register("gpu-07", host="machine-b")

    assert nodes.heartbeat(name="gpu-07", host_id="machine-a", now=timezone.now()) is False
    assert nodes.heartbeat(name="gpu-07", host_id="machine-b", now=timezone.now()) is True
    with pytest.raises(nodes.NodeNameTaken):
        _register("gpu-07", host="machine-a")


def test_a_gpu_count_that_disagrees_with_the_gpus_listed_is_refused():
    with pytest.raises(ValueError, match="1000000 GPUs"):
        _register("gpu-07", host="machine-a", gpus=1_000_000, gpu_list=[{"index": 0, "uuid": "GPU-0"}])
    assert not Node.objects.filter(name="gpu-07").exists()


def test_the_agent_names_its_machine_by_its_machine_id(tmp_path):
    machine_id = tmp_path / "machine-id"
    machine_id.write_text("0123456789abcdef0123456789abcdef\n")
    assert node_agent.host_identity(candidates=(tmp_path / "absent", machine_id), configured="") == (
        "0123456789abcdef0123456789abcdef"
    )
    assert node_agent.host_identity(candidates=(tmp_path / "absent",), configured="").startswith("host:")


def test_an_agent_in_a_container_names_its_machine_as_configured(tmp_path, settings):
    """A container's host name changes with each container: the next one would be refused for the timeout."""
    settings.E31_NODE_HOST_ID = "gpu-box-7"
    assert node_agent.host_identity(candidates=(tmp_path / "absent",)) == "gpu-box-7"
