"""What taking an attempt's space on the node's disk costs: making and mounting a bounded space of the default
size (10 GB of scratch, the log cap) with its blocks allocated, against the sparse image spaces were before
(the same mkfs and mount, blocks taken only as a job writes), alternating, medians; then what ``fstrim`` gives
back after a run that used 1 GB of it. Root (loop mounts), no database.

    sudo python bench/attempt_space.py [--rounds 9] [--dir /var/tmp]

Last line: {"make_ms": {"allocated", "sparse"}, "ratio", "allocated_gb", "trim_ms", "after_trim_gb"}.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "e31web.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from jobs import attempt_space  # noqa: E402

GB = 10**9


def sparse(root: Path, size: int) -> None:
    """A space as it was made before: a sparse image (mke2fs's default discard keeps it so)."""
    root.mkdir()
    image = root / attempt_space.IMAGE
    with image.open("wb") as handle:
        handle.truncate(size)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", str(image)], check=True)
    subprocess.run(["mount", "-o", attempt_space.MOUNT_OPTIONS, str(image), str(root)], check=True)


def allocated(root: Path, size: int) -> None:
    assert attempt_space.bound(root, size=size), "this machine cannot mount a loop filesystem"


def timed(make, root: Path, size: int) -> float:
    began = time.perf_counter()
    make(root, size)
    elapsed = (time.perf_counter() - began) * 1000
    attempt_space.release(root)
    root.rmdir()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument(
        "--dir", default="/var/tmp", help="where the images go: a directory on the node's disk"
    )
    args = parser.parse_args()
    size = attempt_space.size_for(
        output_bytes=0, scratch_bytes=settings.E31_SCRATCH_BYTES, log_bytes=settings.E31_LOG_CAP_BYTES
    )
    under = Path(tempfile.mkdtemp(prefix="e31-space-bench-", dir=args.dir))
    try:
        times = {"allocated": [], "sparse": []}
        for i in range(args.rounds):
            for name, make in (("allocated", allocated), ("sparse", sparse)):
                times[name].append(timed(make, under / f"{name}-{i}", size))
        root = under / "trimmed"
        before = shutil.disk_usage(under).used
        allocated(root, size)
        taken = shutil.disk_usage(under).used - before
        with (root / "used").open("wb") as out:
            for _ in range(1000):
                out.write(b"x" * 10**6)
            os.fsync(out.fileno())
        began = time.perf_counter()
        attempt_space.give_back_unused(root)
        trim_ms = (time.perf_counter() - began) * 1000
        kept = shutil.disk_usage(under).used - before
        attempt_space.release(root)
    finally:
        attempt_space.release_all(under)
        shutil.rmtree(under, ignore_errors=True)
    medians = {name: round(statistics.median(values), 1) for name, values in times.items()}
    print(json.dumps({
        "space_gb": round(size / GB, 3), "make_ms": medians,
        "ratio": round(medians["allocated"] / medians["sparse"], 2),
        "allocated_gb": round(taken / GB, 3), "trim_ms": round(trim_ms, 1), "after_trim_gb": round(kept / GB, 3),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
