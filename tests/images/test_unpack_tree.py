"""An unpacked root is walked whatever its depth, and is tamed from its own folder down."""

import contextlib
import inspect
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.transfers import registry

# Past the recursion limit the test sets (_shallow_stack), within PATH_MAX. 1,050 folders past the default limit
# took 45 s on two cores, umoci's own work growing with the depth squared; 400 past a lowered one take seconds.
DEPTH = 400
pytestmark = pytest.mark.skipif(
    not shutil.which("umoci"), reason="unreachable: bin/ensure-services installs umoci"
)


def _layout(tmp_path: Path, shape) -> Path:
    """An OCI layout (tag ``registry.LAYOUT_TAG``) whose root ``shape(rootfs)`` made."""
    layout, bundle = tmp_path / "layout", tmp_path / "built"
    tag = f"{layout}:{registry.LAYOUT_TAG}"
    subprocess.run(["umoci", "init", "--layout", str(layout)], check=True)
    subprocess.run(["umoci", "new", "--image", tag], check=True)
    subprocess.run(["umoci", "unpack", "--rootless", "--image", tag, str(bundle)], check=True)
    shape(bundle / "rootfs")
    subprocess.run(["umoci", "repack", "--image", tag, str(bundle)], check=True)
    _remove(bundle)
    return layout


def _remove(tree: Path) -> None:
    subprocess.run(["rm", "-rf", str(tree)], check=True)  # shutil.rmtree recurses once per level too


@contextlib.contextmanager
def _shallow_stack(frames: int = 200):
    """Python's recursion limit ``frames`` above this call's depth, for what runs inside."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + frames)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def _folders_recursively(folder: Path) -> int:
    """A walk that recurses once per level, as os.walk did."""
    return 1 + sum(
        _folders_recursively(Path(e.path)) for e in os.scandir(folder) if e.is_dir(follow_symlinks=False)
    )


def _unpack(tmp_path: Path, layout: Path) -> Path:
    bundle = tmp_path / "bundle"
    registry.unpack(layout, bundle, beat=lambda: None, cap=registry.Cap(bytes=10**9, why="the test's cap"))
    return bundle / "rootfs"


def test_an_image_nested_past_pythons_recursion_limit_unpacks(tmp_path):
    """os.walk recursed once per level: an image 1,050 folders deep raised RecursionError from the unpack, which
    no stage caught, and the job stayed in STAGING, pulled and unpacked again every reconciler period. The same
    holds for a tree deeper than a lowered limit, which costs far less to build."""

    def deep(rootfs: Path) -> None:
        leaf = rootfs
        for _ in range(DEPTH):  # Path.mkdir(parents=True) recurses too
            leaf = leaf / "a"
            leaf.mkdir()
        (leaf / "bottom").write_bytes(b"x" * 10)
        (leaf / "bottom").chmod(0o4777)

    try:
        layout = _layout(tmp_path, deep)
        with _shallow_stack():
            rootfs = _unpack(tmp_path, layout)
            assert (
                registry.tree_bytes(rootfs) == (DEPTH + 1) * registry.ENTRY_BYTES
            )  # each folder and the file
            with pytest.raises(RecursionError):  # the tree is deep enough to fail a walk that recurses
                _folders_recursively(rootfs)
        bottom = rootfs.joinpath(*["a"] * DEPTH, "bottom")
        assert stat.S_IMODE(bottom.stat().st_mode) == 0o775  # 4777 tamed all the way down
    finally:
        _remove(tmp_path)


def test_an_images_world_writable_root_folder_is_tamed_too(tmp_path):
    """The walk treated what is inside the root, never the root itself: an image whose / is 0777 left a
    world-writable rootfs in the node's cache, where any local user could swap a team's /usr."""
    rootfs = _unpack(tmp_path, _layout(tmp_path, lambda rootfs: rootfs.chmod(0o777)))
    assert not stat.S_IMODE(rootfs.stat().st_mode) & (stat.S_IWOTH | stat.S_ISUID | stat.S_ISGID)


def test_a_folder_the_stager_cannot_list_fails_the_unpack_with_a_reason(tmp_path, monkeypatch):
    """os.walk left such a folder out in silence; the list walk raised a bare OSError that no stage caught, and
    the job stayed in STAGING. It is a failed transfer that names the folder."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "locked").mkdir(parents=True)

    def unreadable(root):
        raise PermissionError(13, "Permission denied", str(rootfs / "locked"))
        yield  # a generator, as trees.entries is

    monkeypatch.setattr(registry.trees, "entries", unreadable)
    with pytest.raises(registry.transfers.TransferFailed, match="'locked': Permission denied"):
        registry._tame(rootfs)
    with pytest.raises(registry.transfers.TransferFailed, match="cannot be measured"):
        registry._GrowthLimit(rootfs, registry.Cap(bytes=10, why="the test's cap")).check(whole=True)


def test_folders_and_links_count_for_the_disk_they_take_not_nothing(tmp_path):
    """Found by trying it: an image of 40,000 empty folders and 200 KB of padding was counted at 3.8 MB (file sizes
    only) while it held 168 MB and 40,000 inodes on disk, 339 times what its pull moved: past the unpack ratio and
    the cache's room, for the 7 days an unused entry stays. Every entry now counts at least one block (its inode
    too), a file at least what its blocks take."""
    root = tmp_path / "tree"
    root.mkdir()
    for i in range(1000):
        (root / f"d{i}").mkdir()
    (root / "small").write_bytes(b"x" * 10)
    (root / "link").symlink_to("small")
    counted = registry.tree_bytes(root)
    assert counted >= 1002 * registry.ENTRY_BYTES, counted
