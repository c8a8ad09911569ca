"""The GPUs of this node and what they are doing: NVML first, ``nvidia-smi`` where NVML cannot load.

Runs on the node, with the standard library and NVIDIA's own bindings (``nvidia-ml-py``, module
``pynvml``). A GPU is known by its device minor (``/dev/nvidiaN``): NVML's and nvidia-smi's indices
renumber when a GPU falls off the bus, the minor does not, and it is what a job's devices bind.
Virtual GPUs (``--virtual-gpus``) are made up here and never sampled.
"""

import re
import shutil
import subprocess
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pynvml

NVML, SMI, VIRTUAL = "nvml", "nvidia-smi", "virtual"
SMI_FIELDS = "index,uuid,name,memory.total,driver_version,pci.bus_id"
SMI_SAMPLE_FIELDS = "uuid,utilization.gpu,memory.used,power.draw,temperature.gpu"
PROC_GPUS = Path("/proc/driver/nvidia/gpus")  # <bus id>/information holds "Device Minor: N"
SMI_TIMEOUT_S = 20


@dataclass(frozen=True)
class Gpu:
    index: int  # the device minor: /dev/nvidia<index>
    uuid: str
    model: str
    memory_bytes: int
    driver_version: str = ""
    cuda_version: str = ""
    virtual: bool = False


@dataclass(frozen=True)
class Sample:
    index: int
    utilisation: float  # percent of the last sample period a kernel ran
    memory_used_bytes: int
    power_w: float | None  # None where the GPU does not report it
    temperature_c: float | None


def discover() -> tuple[list[Gpu], str]:
    """The node's GPUs by index and where they were read from; ``([], "")`` on a node without any."""
    try:
        return _nvml_gpus(), NVML
    except (pynvml.NVMLError, OSError):
        pass
    found = _smi_gpus()
    return (found, SMI) if found else ([], "")


def virtual(count: int, model: str = VIRTUAL) -> list[Gpu]:
    return [Gpu(index=i, uuid="", model=model, memory_bytes=0, virtual=True) for i in range(count)]


def capped(found: Sequence[Gpu], cap: int | None) -> list[Gpu]:
    """The first ``cap`` GPUs by index (all of them without a cap): an operator may keep some back."""
    ordered = sorted(found, key=lambda gpu: gpu.index)
    return ordered if cap is None else ordered[:cap]


def sample(gpus: Iterable[Gpu], source: str) -> list[Sample]:
    """One reading of each real GPU; those that do not answer are left out (they may have fallen off)."""
    real = [gpu for gpu in gpus if not gpu.virtual]
    if not real or source not in (NVML, SMI):
        return []
    try:
        return _nvml_samples(real) if source == NVML else _smi_samples(real)
    except (pynvml.NVMLError, OSError, subprocess.SubprocessError):
        return []


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _nvml_gpus() -> list[Gpu]:
    pynvml.nvmlInit()
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = _cuda_text(pynvml.nvmlSystemGetCudaDriverVersion())
        found = []
        for position in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(position)
            found.append(
                Gpu(
                    index=pynvml.nvmlDeviceGetMinorNumber(handle), uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    model=_text(pynvml.nvmlDeviceGetName(handle)),
                    memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                    driver_version=driver, cuda_version=cuda,
                )
            )  # fmt: skip
        return found
    finally:
        pynvml.nvmlShutdown()


def _cuda_text(version: int) -> str:
    """NVML's 12040 is CUDA 12.4."""
    return f"{version // 1000}.{version % 1000 // 10}" if version else ""


def _nvml_samples(gpus: Sequence[Gpu]) -> list[Sample]:
    pynvml.nvmlInit()
    try:
        return [s for gpu in gpus if (s := _nvml_sample(gpu))]
    finally:
        pynvml.nvmlShutdown()


def _nvml_sample(gpu: Gpu) -> Sample | None:
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
        utilisation = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        used = pynvml.nvmlDeviceGetMemoryInfo(handle).used
    except pynvml.NVMLError:  # gone from the bus, or lost: the next discovery says which
        return None
    return Sample(
        index=gpu.index, utilisation=float(utilisation), memory_used_bytes=int(used),
        power_w=_optional(lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000),
        temperature_c=_optional(lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
    )  # fmt: skip


def _optional(read) -> float | None:
    try:
        return float(read())
    except pynvml.NVMLError:  # not supported on this model
        return None


def _smi(*args: str) -> str:
    smi = shutil.which("nvidia-smi")
    if not smi:
        raise FileNotFoundError("nvidia-smi")
    done = subprocess.run([smi, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    if done.returncode != 0:
        raise subprocess.SubprocessError(done.stderr.strip() or f"nvidia-smi exited {done.returncode}")
    return done.stdout


def _smi_rows(fields: str) -> list[list[str]]:
    out = _smi(f"--query-gpu={fields}", "--format=csv,noheader,nounits")
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]


def _smi_gpus() -> list[Gpu]:
    try:
        rows = _smi_rows(SMI_FIELDS)
        cuda = _smi_cuda_version()
    except (OSError, subprocess.SubprocessError):
        return []
    return [
        Gpu(index=_minor(bus_id, int(index)), uuid=uuid, model=name, memory_bytes=_mib(memory),
            driver_version=driver, cuda_version=cuda)
        for index, uuid, name, memory, driver, bus_id in rows
    ]  # fmt: skip


def _smi_cuda_version() -> str:
    """Only nvidia-smi's banner states the CUDA version the driver supports."""
    match = re.search(r"CUDA Version:\s*([\d.]+)", _smi())
    return match.group(1) if match else ""


def _minor(bus_id: str, index: int) -> int:
    """The device minor the driver lists for this PCI address; nvidia-smi's index where it lists none."""
    domain, _, rest = bus_id.lower().partition(":")
    information = PROC_GPUS / f"{domain[-4:]}:{rest}" / "information"
    try:
        match = re.search(r"Device Minor:\s*(\d+)", information.read_text())
    except OSError:
        return index
    return int(match.group(1)) if match else index


def _smi_samples(gpus: Sequence[Gpu]) -> list[Sample]:
    by_uuid = {gpu.uuid: gpu.index for gpu in gpus}
    return [
        Sample(index=by_uuid[uuid], utilisation=float(util), memory_used_bytes=_mib(used),
               power_w=_number(power), temperature_c=_number(temperature))
        for uuid, util, used, power, temperature in _smi_rows(SMI_SAMPLE_FIELDS)
        if uuid in by_uuid and _number(util) is not None
    ]  # fmt: skip


def _mib(text: str) -> int:
    return int(float(text) * 2**20) if _number(text) is not None else 0


def _number(text: str) -> float | None:
    """nvidia-smi writes '[N/A]' or '[Not Supported]' where a GPU does not report a value."""
    try:
        return float(text)
    except ValueError:
        return None


@dataclass
class _Minute:
    samples: int = 0
    utilisation_sum: float = 0.0
    utilisation_max: float = 0.0
    memory_used_max_bytes: int = 0
    power_sum_w: float = 0.0
    power_samples: int = 0
    temperature_max_c: float | None = None

    def add(self, s: Sample) -> None:
        self.samples += 1
        self.utilisation_sum += s.utilisation
        self.utilisation_max = max(self.utilisation_max, s.utilisation)
        self.memory_used_max_bytes = max(self.memory_used_max_bytes, s.memory_used_bytes)
        if s.power_w is not None:
            self.power_sum_w += s.power_w
            self.power_samples += 1
        if s.temperature_c is not None:
            self.temperature_max_c = max(self.temperature_max_c or s.temperature_c, s.temperature_c)


class Minutes:
    """Samples of allocated GPUs folded into one summary per (allocation, GPU, UTC minute).

    ``add`` takes each sample with its time; ``closed`` hands over the minutes that are over, and those
    of allocations no longer running (their last, partial minute), each once.
    """

    def __init__(self) -> None:
        self._open: dict[tuple[int, int, datetime], _Minute] = {}

    def add(self, *, allocation_id: int, sample: Sample, at: datetime) -> None:
        key = (allocation_id, sample.index, at.replace(second=0, microsecond=0))
        self._open.setdefault(key, _Minute()).add(sample)

    def closed(self, *, now: datetime, running: Collection[int]) -> list[dict]:
        current = now.replace(second=0, microsecond=0)
        done = [key for key in self._open if key[2] < current or key[0] not in running]
        return [self._summary(key, self._open.pop(key)) for key in sorted(done)]

    @staticmethod
    def _summary(key: tuple[int, int, datetime], m: _Minute) -> dict:
        allocation_id, index, minute = key
        return {
            "allocation_id": allocation_id, "gpu_index": index, "minute": minute, "samples": m.samples,
            "utilisation_avg": m.utilisation_sum / m.samples, "utilisation_max": m.utilisation_max,
            "memory_used_max_bytes": m.memory_used_max_bytes,
            "power_avg_w": m.power_sum_w / m.power_samples if m.power_samples else None,
            "temperature_max_c": m.temperature_max_c,
        }  # fmt: skip
