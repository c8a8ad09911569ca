"""What a test needs of the machine it runs on: root, bubblewrap, the v1 devices hierarchy, the shared traces.

A test marked ``needs(...)`` is skipped with what is missing, unless E31_REQUIRE_ALL=1, where it fails: .ci/run
sets it, for the CI machines run as root with bubblewrap, the v1 devices hierarchy and ../shared/traces beside
the checkout. tests/conftest.py reads the mark before the test's fixtures are set up.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from jobs import devices

FLAG = "E31_REQUIRE_ALL"


def lacking(*, root: bool = False, bwrap: bool = False, devices_cgroup: bool = False, paths=()) -> str:
    """What of ``root``, ``bwrap``, ``devices_cgroup`` and ``paths`` this machine lacks ('' for nothing)."""
    missing = []
    if root and os.geteuid() != 0:
        missing.append("root")
    if bwrap and not shutil.which("bwrap"):
        missing.append("bubblewrap on PATH")
    if devices_cgroup and not devices.DEVICES_CGROUP.is_dir():
        missing.append(f"the v1 devices hierarchy at {devices.DEVICES_CGROUP}")
    missing += [str(path) for path in map(Path, paths) if not path.exists()]
    return ", ".join(missing)


def needs(**what) -> pytest.MarkDecorator:
    """Marks a test (or a module, as ``pytestmark``) as needing ``what`` (the arguments of ``lacking``)."""
    return pytest.mark.needs(lacking(**what))


def missing(what: str) -> None:
    """Skips the test for lacking ``what``; fails it under E31_REQUIRE_ALL=1."""
    if os.environ.get(FLAG) == "1":
        pytest.fail(f"{FLAG}=1 but this machine lacks {what}")
    pytest.skip(f"this machine lacks {what} (set {FLAG}=1 to make this a failure)")


def clear_leftovers(*prefixes: str, routes: tuple[str, ...] = ()) -> None:
    """Removes the network namespaces and nftables tables whose names start with one of ``prefixes``, and
    ``routes``, that a run killed mid-test left on this machine (their veths go with their namespaces). Left, a stale
    uplink's network shadows the new one's, and the new stand-in for the internet is never reached."""

    def listed(*cmd: str) -> list[str]:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.split()

    for name in listed("ip", "netns", "list"):
        if name.startswith(prefixes):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
    for name in listed("nft", "list", "tables"):
        if name.startswith(prefixes):
            subprocess.run(["nft", "delete", "table", "inet", name], capture_output=True, timeout=20)
    for route in routes:
        subprocess.run(["ip", "route", "del", route], capture_output=True, timeout=20)
