"""A real registry on 127.0.0.1 (Debian's docker-registry) and images built here with umoci.

Its access log tells how many layer bytes each pull really moved. Used by the tests' fixtures
and by bench/image_pull.py.
"""

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import tarfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "echo", "cat", "env", "pwd", "ls", "id", "touch", "test", "sleep")
BLOB_GET = re.compile(r'"GET /v2/(\S+)/blobs/sha256:[0-9a-f]{64} HTTP/[0-9.]+" 200 (\d+)')
# Env, WorkingDir, Entrypoint and Cmd of the tests' base image: the job prints them back.
BASE_CONFIG = {
    "env": ["PATH=/bin", "GREETING=hello from the image"],
    "workingdir": "/srv",
    "entrypoint": ["/bin/sh", "-c"],
    "cmd": ['echo "$GREETING in $(pwd) as $(id -u)"'],
}


@dataclass
class Registry:
    host: str
    log: Path
    proc: subprocess.Popen

    def blob_bytes(self) -> int:
        """Layer and config bytes the registry has served so far (its access log, 200 answers)."""
        return sum(int(m.group(2)) for m in BLOB_GET.finditer(self.log.read_text(errors="replace")))

    def digest(self, reference: str) -> str:
        done = subprocess.run(
            ["skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}", f"docker://{self.host}/{reference}"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return done.stdout.strip()


def _free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def build_image(
    layout: Path,
    *,
    files: dict[str, bytes] | None = None,
    config: dict = BASE_CONFIG,
    random_bytes: int = 0,
) -> None:
    """An OCI layout holding one image: busybox and its applets, /srv, the given files, the given config,
    and ``random_bytes`` of incompressible data under /data (files of 64 MB), for sizes that matter."""
    subprocess.run(["umoci", "init", "--layout", str(layout)], check=True)
    subprocess.run(["umoci", "new", "--image", f"{layout}:t"], check=True)
    bundle = layout.parent / f"{layout.name}-bundle"
    subprocess.run(["umoci", "unpack", "--rootless", "--image", f"{layout}:t", str(bundle)], check=True)
    rootfs = bundle / "rootfs"
    (rootfs / "bin").mkdir()
    (rootfs / "srv").mkdir()
    (rootfs / "etc").mkdir()
    (rootfs / "etc" / "image-release").write_text("tests\n")
    shutil.copy(BUSYBOX, rootfs / "bin" / "busybox")
    for applet in APPLETS:
        (rootfs / "bin" / applet).symlink_to("busybox")
    _write_random(rootfs / "data", random_bytes)
    for name, content in (files or {}).items():
        (rootfs / name).parent.mkdir(parents=True, exist_ok=True)
        (rootfs / name).write_bytes(content)
    subprocess.run(["umoci", "repack", "--image", f"{layout}:t", str(bundle)], check=True)
    args = [f"--config.env={e}" for e in config.get("env", [])]
    args += [f"--config.entrypoint={e}" for e in config.get("entrypoint", [])]
    args += [f"--config.cmd={c}" for c in config.get("cmd", [])]
    if config.get("workingdir"):
        args.append(f"--config.workingdir={config['workingdir']}")
    subprocess.run(["umoci", "config", "--image", f"{layout}:t", *args], check=True)
    shutil.rmtree(bundle)


def _write_random(folder: Path, size: int, chunk: int = 64 * 2**20) -> None:
    for index, offset in enumerate(range(0, size, chunk)):
        folder.mkdir(exist_ok=True)
        (folder / f"blob-{index:04d}").write_bytes(os.urandom(min(chunk, size - offset)))


def push(layout: Path, registry: Registry, reference: str) -> str:
    """Pushes the layout's image as ``reference`` (repository:tag); returns its manifest digest."""
    subprocess.run(
        ["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:t", f"docker://{registry.host}/{reference}"],
        check=True,
    )  # fmt: skip
    return registry.digest(reference)


def push_understated(registry: Registry, reference: str, *, layer_bytes: int, declared: int) -> None:
    """Pushes, over the registry's own API, an image whose one layer (``layer_bytes`` of incompressible data,
    gzipped) its manifest declares as ``declared`` bytes: the registry takes the manifest as it is written."""
    repository, tag = reference.rsplit(":", 1)
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as archive:
        data = os.urandom(layer_bytes)
        member = tarfile.TarInfo("data/big.bin")
        member.size = len(data)
        archive.addfile(member, io.BytesIO(data))
    layer = gzip.compress(tar.getvalue(), compresslevel=1)
    config = json.dumps({
        "architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(tar.getvalue()).hexdigest()]},
    }).encode()  # fmt: skip
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": _put_blob(registry, repository, config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": _put_blob(registry, repository, layer), "size": declared}],
    }).encode()  # fmt: skip
    _call(registry, "PUT", f"/v2/{repository}/manifests/{tag}", manifest,
          {"Content-Type": "application/vnd.oci.image.manifest.v1+json"})  # fmt: skip


def _put_blob(registry: Registry, repository: str, blob: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    location = _call(registry, "POST", f"/v2/{repository}/blobs/uploads/").headers["Location"]
    location = location.removeprefix(f"http://{registry.host}")
    joined = "&" if "?" in location else "?"
    _call(
        registry,
        "PUT",
        f"{location}{joined}digest={digest}",
        blob,
        {"Content-Type": "application/octet-stream"},
    )
    return digest


def _call(registry: Registry, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    request = urllib.request.Request(
        f"http://{registry.host}{path}", data=body, method=method, headers=headers or {}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
        return response


def start(
    root: Path, *, address: str = "127.0.0.1", tls: tuple[Path, Path] | None = None, realm: str = ""
) -> Registry:
    """A registry storing under ``root``, listening on a free port of ``address``: over TLS with ``tls`` (its
    certificate and key files), and with them asking for a bearer token from ``realm`` when one is named."""
    port = _free_port(address)
    config = root / "config.yml"
    text = (
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\nhttp:\n  addr: {address}:{port}\n"
    )
    if tls:
        text += f"  tls:\n    certificate: {tls[0]}\n    key: {tls[1]}\n"
    if realm:  # the token service's certificate: any will do, no token is ever issued
        text += f"auth:\n  token:\n    realm: {realm}\n    service: tests\n    issuer: tests\n    rootcertbundle: {tls[0]}\n"
    config.write_text(text)
    log = root / "access.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["docker-registry", "serve", str(config)], stdout=out, stderr=subprocess.STDOUT
        )
    deadline = time.monotonic() + 20
    while socket.socket().connect_ex((address, port)) != 0:
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError(f"the registry did not start: {log.read_text()[-500:]}")
        time.sleep(0.05)
    return Registry(host=f"{address}:{port}", log=log, proc=proc)


def stop(registry: Registry) -> None:
    registry.proc.terminate()
    registry.proc.wait(timeout=10)
