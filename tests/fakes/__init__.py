"""Stand-ins for what only a GPU machine has: nvidia-smi (``bin/``, reading a JSON file) and NVML."""

import json
from pathlib import Path
from types import SimpleNamespace

import pynvml

FAKE_BIN = Path(__file__).parent / "bin"


def h100(index: int, *, util: float = 0, power: float | str = 70.0, temp: float = 35) -> dict:
    return {"index": index, "uuid": f"GPU-{index:08x}-aaaa-bbbb-cccc-{index:012x}", "name": "NVIDIA H100 80GB HBM3",
            "memory_mib": 81559, "bus_id": f"00000000:{0x17 + index:02X}:00.0", "util": util,
            "memory_used_mib": 1024 * index, "power": power, "temp": temp}  # fmt: skip


def write_gpus(
    path: Path, gpus: list[dict], *, driver: str = "550.54.15", cuda: str = "12.4", delay_s: float = 0
) -> Path:
    """The fake nvidia-smi's whole state, replaced atomically (the agent may read it at any moment).

    ``delay_s``: each answer takes that long, as nvidia-smi does on a busy or wedged node.
    """
    staged = path.with_suffix(".new")
    staged.write_text(json.dumps({"driver": driver, "cuda": cuda, "gpus": gpus, "delay_s": delay_s}))
    staged.replace(path)
    return path


def fake_nvml(monkeypatch, gpus: list[dict], *, driver: str = "550.54.15", cuda: int = 12040) -> None:
    """NVML's Python bindings answering for ``gpus`` (the same dicts as the fake nvidia-smi's)."""
    by_handle = {f"h{g['minor'] if 'minor' in g else g['index']}": g for g in gpus}
    handles = list(by_handle)
    by_uuid = {g["uuid"]: h for h, g in by_handle.items()}

    def gpu(handle: str) -> dict:
        if handle not in by_handle:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return by_handle[handle]

    def power(handle: str) -> int:
        value = gpu(handle)["power"]
        if isinstance(value, str):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(value * 1000)  # milliwatts

    def handle_by_uuid(uuid: str) -> str:
        if uuid not in by_uuid:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return by_uuid[uuid]

    replacements = {
        "nvmlInit": lambda: None, "nvmlShutdown": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: driver, "nvmlSystemGetCudaDriverVersion": lambda: cuda,
        "nvmlDeviceGetCount": lambda: len(handles), "nvmlDeviceGetHandleByIndex": lambda i: handles[i],
        "nvmlDeviceGetHandleByUUID": handle_by_uuid,
        "nvmlDeviceGetMinorNumber": lambda h: gpu(h).get("minor", gpu(h)["index"]),
        "nvmlDeviceGetUUID": lambda h: gpu(h)["uuid"], "nvmlDeviceGetName": lambda h: gpu(h)["name"].encode(),
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(
            total=gpu(h)["memory_mib"] * 2**20, used=gpu(h)["memory_used_mib"] * 2**20),
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=gpu(h)["util"], memory=0),
        "nvmlDeviceGetPowerUsage": power,
        "nvmlDeviceGetTemperature": lambda h, sensor: gpu(h)["temp"],
    }  # fmt: skip
    for name, fake in replacements.items():
        monkeypatch.setattr(pynvml, name, fake)
