"""bench/gpu_node.sh, run here on stand-in GPUs: nvidia-smi answering from a file and device nodes that are
copies of /dev/null. No CUDA here, so cuda_ok is false; everything else of its JSON line is measured."""

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.fakes import FAKE_BIN, h100, write_gpus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(330)]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_devices():
    root = Path(tempfile.mkdtemp(prefix="e31-bench-dev-"))
    root.chmod(0o755)  # job uids pass through it: bubblewrap binds as them
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        os.mknod(root / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        (root / name).chmod(0o666)
    yield root
    shutil.rmtree(root)


def test_the_gpu_node_bench_prints_its_json_line_from_a_node_that_found_its_gpus(fake_devices, tmp_path):
    gpus_file = write_gpus(tmp_path / "gpus.json", [h100(0, util=40), h100(1, util=60)])
    env = {**os.environ, "PATH": f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}", "E31_FAKE_GPUS": str(gpus_file),
           "E31_DEVICE_ROOT": str(fake_devices)}  # fmt: skip
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "E31_STATE_DIR"):  # the bench brings its own
        env.pop(name, None)
    done = subprocess.run(
        ["bench/gpu_node.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=320
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["gpus_discovered"], result["model"], result["gpu_source"]) == (
        2,
        "NVIDIA H100 80GB HBM3",
        "nvidia-smi",
    )
    assert result["sandbox"] == "bubblewrap"
    assert "memory" in result["limits"] and result["memory_limit_held"] is True
    (mine,), (theirs,) = result["job_gpus"], result["neighbour_gpus"]
    assert mine != theirs
    assert result["job_devices"] == [f"nvidia{mine}", "nvidiactl"]  # its GPU and the control device, no other
    assert result["visible"] == h100(mine)["uuid"]
    assert result["foreign_gpu_visible"] is False
    assert result["cuda_ok"] is False and result["job_device_count"] == 0  # no driver on this machine
    assert result["metrics_samples"] >= 1  # sampled while the job held its GPU ~10 s (few under load)
