"""The agent finds its GPUs through NVML, else nvidia-smi; virtual GPUs only when asked."""

import os

import pytest
from django.core.management.base import CommandError

from jobs import gpus
from jobs.management.commands import node_agent
from tests.fakes import FAKE_BIN, fake_nvml, h100, write_gpus


@pytest.fixture
def no_nvml(monkeypatch):
    """This machine has no NVIDIA driver: NVML's library does not load (as the real bindings say here)."""

    def missing() -> None:
        raise pynvml_error(12)  # NVML_ERROR_LIBRARY_NOT_FOUND

    monkeypatch.setattr(gpus.pynvml, "nvmlInit", missing)


def pynvml_error(code: int):
    return gpus.pynvml.NVMLError(code)


@pytest.fixture
def fake_smi(monkeypatch, tmp_path):
    """nvidia-smi on PATH answering from a file the test writes."""
    state = tmp_path / "gpus.json"
    monkeypatch.setenv("PATH", f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("E31_FAKE_GPUS", str(state))
    return state


def test_nvml_registers_each_gpu_by_its_device_minor_with_uuid_model_memory_and_versions(monkeypatch):
    # NVML enumerates two GPUs; the second is /dev/nvidia3 (GPUs 1 and 2 are gone from the bus).
    fake_nvml(monkeypatch, [h100(0), {**h100(1), "minor": 3}])
    found, source = gpus.discover()
    assert source == gpus.NVML
    assert [g.index for g in found] == [0, 3]
    assert found[1] == gpus.Gpu(index=3, uuid=h100(1)["uuid"], model="NVIDIA H100 80GB HBM3",
                                memory_bytes=81559 * 2**20, driver_version="550.54.15", cuda_version="12.4")  # fmt: skip


def test_without_nvml_nvidia_smi_is_asked_and_its_banner_gives_the_cuda_version(no_nvml, fake_smi):
    write_gpus(fake_smi, [h100(0), h100(1)], driver="535.104.05", cuda="12.2")
    found, source = gpus.discover()
    assert source == gpus.SMI
    assert [(g.index, g.uuid, g.model) for g in found] == [
        (i, h100(i)["uuid"], "NVIDIA H100 80GB HBM3") for i in (0, 1)
    ]
    assert {(g.memory_bytes, g.driver_version, g.cuda_version) for g in found} == {
        (81559 * 2**20, "535.104.05", "12.2")
    }
    assert not any(g.virtual for g in found)


def test_a_node_with_neither_finds_no_gpu(no_nvml, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert gpus.discover() == ([], "")


def test_gpus_caps_the_gpus_found_keeping_the_lowest_indices():
    found = [gpus.Gpu(index=i, uuid=f"GPU-{i}", model="H100", memory_bytes=1) for i in (3, 0, 5, 1)]
    assert [g.index for g in gpus.capped(found, 2)] == [0, 1]
    assert [g.index for g in gpus.capped(found, None)] == [0, 1, 3, 5]


def test_the_agent_refuses_to_start_without_gpus_unless_asked_for_virtual_ones(no_nvml, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(CommandError, match="--virtual-gpus"):
        node_agent._find_gpus(cap=8, virtual_gpus=None, gpu_model="")
    found, source = node_agent._find_gpus(cap=None, virtual_gpus=3, gpu_model="")
    assert source == gpus.VIRTUAL
    assert [(g.index, g.model, g.virtual, g.uuid) for g in found] == [
        (i, "virtual", True, "") for i in range(3)
    ]


def test_the_agent_registers_what_it_found_capped(no_nvml, fake_smi):
    write_gpus(fake_smi, [h100(i) for i in range(4)])
    found, source = node_agent._find_gpus(cap=2, virtual_gpus=None, gpu_model="")
    fields = node_agent._gpu_fields(found, source)
    assert (fields["gpus"], fields["gpu_model"], fields["gpu_source"]) == (
        2,
        "NVIDIA H100 80GB HBM3",
        "nvidia-smi",
    )
    assert [g["uuid"] for g in fields["gpu_list"]] == [h100(0)["uuid"], h100(1)["uuid"]]
    assert node_agent._uuids(found) == {0: h100(0)["uuid"], 1: h100(1)["uuid"]}


def test_nvml_samples_utilisation_memory_power_and_temperature(monkeypatch):
    fake_nvml(monkeypatch, [h100(0, util=87, power=312.5, temp=64), h100(1, util=3, power="[N/A]")])
    found, source = gpus.discover()
    assert gpus.sample(found, source) == [
        gpus.Sample(index=0, utilisation=87.0, memory_used_bytes=0, power_w=312.5, temperature_c=64.0),
        gpus.Sample(index=1, utilisation=3.0, memory_used_bytes=2**30, power_w=None, temperature_c=35.0),
    ]


def test_nvidia_smi_samples_the_same_and_leaves_out_what_a_gpu_does_not_report(no_nvml, fake_smi):
    write_gpus(fake_smi, [h100(0, util=55, power="[N/A]", temp=50), h100(1, util=9)])
    found, source = gpus.discover()
    samples = gpus.sample(found, source)
    assert [(s.index, s.utilisation, s.power_w, s.temperature_c) for s in samples] == [
        (0, 55.0, None, 50.0),
        (1, 9.0, 70.0, 35.0),
    ]
    write_gpus(fake_smi, [h100(1, util=9)])  # GPU 0 fell off the bus
    assert [s.index for s in gpus.sample(found, source)] == [1]


def test_virtual_gpus_are_never_sampled():
    assert gpus.sample(gpus.virtual(2), gpus.VIRTUAL) == []
