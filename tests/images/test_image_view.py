"""The sandbox's view of an image (no database): its root as /, read-only, the platform's parts under /e31."""

import os
from pathlib import Path

import pytest

from jobs import sandbox

JOB_UID = 398765


def rootfs(tmp: Path) -> Path:
    root = tmp / "rootfs"
    for folder in ("usr/bin", "etc/ssl", "var/lib", "srv", "proc", "dev"):
        (root / folder).mkdir(parents=True)
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\nintruder:x:0:0::/:/bin/sh\n")
    (root / "etc" / "os-release").write_text("ID=tests\n")
    (root / "bin").symlink_to("usr/bin")
    (root / "etc" / "mtab").symlink_to("/proc/self/mounts")
    return root


def attempt(tmp: Path) -> sandbox.AttemptDirs:
    root = tmp / "attempt"
    dirs = sandbox.AttemptDirs(root=root, work=root / "work", output=root / "output", data=tmp / "data")
    dirs.create(owner=JOB_UID if os.geteuid() == 0 else os.getuid())
    (tmp / "data").mkdir()
    sandbox.write_identity(dirs, uid=JOB_UID, gid=JOB_UID)
    return dirs


def test_the_image_root_replaces_the_hosts_system_view(tmp_path):
    root, dirs = rootfs(tmp_path), attempt(tmp_path)
    image = sandbox.ImageView.from_config(
        root, {"Entrypoint": ["/bin/run"], "Cmd": ["--default"], "WorkingDir": "/srv"}
    )
    cmd = sandbox.command(argv=[], env={}, dirs=dirs, workdir="", mode=sandbox.BUBBLEWRAP,
                          confinement=sandbox.Confinement(uid=JOB_UID, gid=JOB_UID), image=image)  # fmt: skip
    triples = list(zip(cmd, cmd[1:], cmd[2:], strict=False))
    assert ("--ro-bind", "/usr", "/usr") not in triples and (
        "--ro-bind",
        str(root / "usr"),
        "/usr",
    ) in triples
    assert ("--symlink", "usr/bin", "/bin") in triples  # recreated, never followed on the host
    assert ("--symlink", "/proc/self/mounts", "/etc/mtab") in triples
    assert ("--ro-bind", str(root / "etc" / "os-release"), "/etc/os-release") in triples
    assert ("--ro-bind", str(root / "etc" / "passwd"), "/etc/passwd") not in triples  # synthesized instead
    assert ("--ro-bind", str(dirs.root / "passwd"), "/etc/passwd") in triples
    assert not any(a == "--ro-bind" and b in (str(root / "proc"), str(root / "dev")) for a, b, _ in triples)
    assert ("--bind", str(dirs.work), "/e31/work") in triples and (
        "--bind",
        str(dirs.output),
        "/e31/output",
    ) in triples
    assert ("--ro-bind", str(dirs.data), "/e31/data") in triples
    assert cmd[cmd.index("--remount-ro") + 1] == "/"
    assert cmd[cmd.index("--chdir") + 1] == "/srv"
    assert cmd[cmd.index("--") + 1 :] == ["/bin/run", "--default"]


def test_argv_replaces_the_images_cmd_and_keeps_its_entrypoint():
    image = sandbox.ImageView.from_config(Path("/x"), {"Entrypoint": ["/bin/sh", "-c"], "Cmd": ["echo hi"]})
    assert image.argv([]) == ["/bin/sh", "-c", "echo hi"]
    assert image.argv(["echo bye"]) == ["/bin/sh", "-c", "echo bye"]
    assert sandbox.ImageView.from_config(Path("/x"), {"Cmd": ["/app"]}).argv(["/other", "-v"]) == [
        "/other",
        "-v",
    ]
    with pytest.raises(ValueError, match="no Entrypoint or Cmd"):
        sandbox.ImageView.from_config(Path("/x"), {}).argv([])


def test_a_declared_workdir_is_inside_the_jobs_own_directory_even_with_an_image(tmp_path):
    image = sandbox.ImageView.from_config(rootfs(tmp_path), {"Cmd": ["/bin/true"], "WorkingDir": "/srv"})
    cmd = sandbox.command(argv=[], env={}, dirs=attempt(tmp_path), workdir="src", mode=sandbox.BUBBLEWRAP,
                          confinement=sandbox.Confinement(uid=JOB_UID, gid=JOB_UID), image=image)  # fmt: skip
    assert cmd[cmd.index("--chdir") + 1] == "/e31/work/src"


def test_the_driver_libraries_are_bound_under_e31_in_an_image(tmp_path):
    lib = tmp_path / "libcuda.so.1"
    lib.write_bytes(b"\x7fELF")
    image = sandbox.ImageView.from_config(rootfs(tmp_path), {"Cmd": ["/bin/true"]})
    cmd = sandbox.command(argv=[], env={}, dirs=attempt(tmp_path), workdir="", mode=sandbox.BUBBLEWRAP,
                          confinement=sandbox.Confinement(uid=JOB_UID, gid=JOB_UID, libraries=(lib,)), image=image)  # fmt: skip
    assert ("--ro-bind", str(lib), "/e31/driver/libcuda.so.1") in list(
        zip(cmd, cmd[1:], cmd[2:], strict=False)
    )
    assert sandbox.image_library_path((lib,)) == ["/e31/driver"]


def test_an_unsandboxed_node_refuses_an_image_rather_than_run_on_the_host(tmp_path):
    image = sandbox.ImageView.from_config(rootfs(tmp_path), {"Cmd": ["/bin/true"]})
    with pytest.raises(ValueError, match="needs the bubblewrap sandbox"):
        sandbox.command(argv=[], env={}, dirs=attempt(tmp_path), workdir="", mode=sandbox.UNSANDBOXED,
                        confinement=sandbox.Confinement(uid=JOB_UID, gid=JOB_UID), image=image)  # fmt: skip
