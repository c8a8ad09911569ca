"""The jobs of bench/gpu_node.sh (which starts the pool): CUDA inside the sandbox, and a neighbour that must
not see it. Not run on its own. Last line: the JSON the issue asks for."""

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "e31web.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.db.models import Sum  # noqa: E402
from django.utils import timezone  # noqa: E402

from accounts import services as accounts  # noqa: E402
from jobs import declaration, services  # noqa: E402
from jobs.models import GpuMinute, Job, Node, NodeGpu  # noqa: E402

MARK = "E31PROBE "
# Runs inside the sandbox with the system Python: the standard library and the driver's libcuda only.
PROBE = r"""
import ctypes, json, os, time
out = {"visible": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
       "devices": sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))}
lib = None
for name in ("libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1", "/usr/local/nvidia/lib/libcuda.so.1"):
    try:
        lib = ctypes.CDLL(name)
        break
    except OSError as exc:
        out["load_error"] = str(exc)
if lib:
    out["cuInit"] = lib.cuInit(0)
    count = ctypes.c_int(0)
    out["cuDeviceGetCount"] = lib.cuDeviceGetCount(ctypes.byref(count))
    out["count"] = count.value
    if out["cuInit"] == 0 and count.value > 0:
        dev, ctx, ptr, size = ctypes.c_int(0), ctypes.c_void_p(), ctypes.c_uint64(0), 1 << 28
        lib.cuDeviceGet(ctypes.byref(dev), 0)
        lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
        lib.cuCtxSetCurrent(ctx)
        out["cuMemAlloc"] = lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size))
        deadline = time.monotonic() + BUSY_S
        while out["cuMemAlloc"] == 0 and time.monotonic() < deadline:  # keeps the GPU busy for the sampler
            lib.cuMemsetD8_v2(ptr, ctypes.c_ubyte(1), ctypes.c_size_t(size))
            lib.cuCtxSynchronize()
        if out["cuMemAlloc"] == 0:
            lib.cuMemFree_v2(ptr)
else:
    time.sleep(BUSY_S)  # no driver (virtual GPUs): hold the GPU as long, so the neighbour overlaps
print("MARK" + json.dumps(out), flush=True)
""".replace("MARK", MARK)


ALLOCATE_1_5_GB = "b = b'x' * 1_500_000_000; print('allocated', len(b), flush=True)"


def wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := predicate():
            return found
        time.sleep(0.5)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def submit(team, user, *, name: str, program: str, memory: str = "") -> Job:
    python = (
        "/usr/bin/python3" if Path("/usr/bin/python3").exists() else os.path.realpath(shutil.which("python3"))
    )
    spec = declaration.validate(
        {"name": name, "work": {"argv": [python, "-c", program]},
         "request": {"gpus": 1, "hours": 0.1, **({"memory": memory} if memory else {})},
         "output": {"uri": f"file://{settings.E31_OUTPUT_ROOTS[0]}/{team.slug}/{name}", "bytes": 1000}},
        limits=services.pool_limits(team=team),
    )  # fmt: skip
    return services.submit_job(team=team, user=user, spec=spec, now=timezone.now())


def probe(job: Job) -> dict:
    job = wait(
        lambda: Job.objects.filter(id=job.id, state__in=("released", "ended")).first(), 150, f"job {job.id}"
    )
    lines = [line for line in job.log_tail.splitlines() if line.startswith(MARK)]
    if not lines:
        raise SystemExit(
            f"job {job.id} ended {job.end_reason} without its probe line: {job.log_tail[-2000:]}"
        )
    return {**json.loads(lines[-1][len(MARK) :]), "gpus": job.allocations.get().gpu_indices}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node", required=True)
    node_name = parser.parse_args().node
    node = wait(lambda: Node.objects.filter(name=node_name, state="up").first(), 120, "the agent to register")
    gpus = list(NodeGpu.objects.filter(node=node, present=True).order_by("index"))
    accounts.ensure_demo_accounts(password="bench")
    user = get_user_model().objects.get(username="demo")
    team = user.memberships.first().team
    first = submit(team, user, name="cuda", program=f"BUSY_S = 10\n{PROBE}")
    wait(lambda: Job.objects.filter(id=first.id, state="running").exists(), 120, "the CUDA job to run")
    second = submit(team, user, name="neighbour", program=f"BUSY_S = 2\n{PROBE}") if len(gpus) > 1 else None
    cuda = probe(first)
    neighbour = probe(second) if second else None
    # The node's memory limit on this kernel: 1.5 GB taken by a job that declared 1 GB.
    hog = submit(team, user, name="memory", program=ALLOCATE_1_5_GB, memory="1 GB")
    hog = wait(lambda: Job.objects.filter(id=hog.id, state__in=("released", "ended")).first(), 120, "the hog")
    if node.gpu_source != "virtual":  # the agent stores the last minute at its next sample after the job
        wait(lambda: GpuMinute.objects.filter(allocation__job=first).exists(), 15, "the job's GPU samples")
    samples = GpuMinute.objects.filter(allocation__job=first).aggregate(n=Sum("samples"))["n"] or 0
    print(json.dumps({
        "gpus_discovered": len(gpus), "model": node.gpu_model, "gpu_source": node.gpu_source,
        "job_device_count": cuda.get("count", 0),
        "cuda_ok": cuda.get("cuInit") == 0 and cuda.get("count", 0) >= 1 and cuda.get("cuMemAlloc") == 0,
        "metrics_samples": samples,
        "foreign_gpu_visible": None if neighbour is None else (
            any(f"nvidia{i}" in neighbour["devices"] for i in cuda["gpus"]) or neighbour.get("count", 0) > 1
        ),
        "memory_limit_held": hog.end_reason == "out_of_memory" if "memory v" in node.limits else None,
        "sandbox": node.sandbox, "limits": node.limits, "job_gpus": cuda["gpus"], "neighbour_gpus": neighbour and neighbour["gpus"],
        "job_devices": cuda["devices"], "visible": cuda["visible"],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
