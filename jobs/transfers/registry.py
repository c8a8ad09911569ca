"""Images from an OCI registry: resolve a reference to a digest, pull it into an OCI layout, unpack it.

``skopeo`` talks to the registry and writes the layout, ``umoci`` unpacks it into a root
filesystem; both are Debian's packages, run as subprocesses with an environment of their own (no
host credential file, none of the node's proxy settings) so a job's pull never borrows the node's
identity. An outside registry's skopeo connects only through an egress proxy of its own call
(``egress``), which pins every connection to checked addresses; a pool's own registry is reached
directly. No database here: staging passes in the registry access and a ``progress`` callback, as for data.
"""

import base64
import hashlib
import json
import os
import platform
import re
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from common import pinned
from jobs import imageref, transfers, trees
from jobs.transfers import egress
from jobs.units import format_size

LAYOUT_TAG = "image"
INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
# What a registry says when the image is not there or not this team's: retrying cannot help.
PERMANENT = (
    "manifest unknown", "name unknown", "not found", "unauthorized", "denied", "authentication required",
    "no such host", "invalid reference", "blob unknown", "digest invalid", "does not match",
)  # fmt: skip
NOT_A_MANIFEST = "the registry's manifest is not a valid image manifest"
# Go's http.ProxyFromEnvironment never proxies "localhost" or a loopback IP literal: a redirect or token realm naming
# one is reached by skopeo itself, around the egress proxy (README, E31_OUTSIDE_REGISTRIES).
AROUND_THE_PROXY = (
    "the registry sent the pull to a loopback address, which skopeo reaches around the egress proxy: "
    "the pull failed, and what answered there is not told"
)
URL_IN_TEXT = re.compile(r"https?://[^\s\"'\\]+")
RUN_CONFIG = ("Env", "Entrypoint", "Cmd", "WorkingDir")
# An unpacking image is measured this often: umoci writes 100-150 MB a second here, so it gets ~15 MB past its
# cap. Measuring lstat()s every file (~0.8 s for 100,000 here): the next measure then waits this many times as
# long as the last one took, so at most a tenth of the unpack goes to it however many files the image holds;
# an image of many files is measured less often (100,000: every ~8 s), and may get that much further.
MEASURE_EVERY_S = 0.1
MEASURE_SPACING = 9
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


@dataclass(frozen=True)
class Access:
    """How this pull reaches its registry: TLS checked or not (a pool's own registry), whose login, and whether
    every connection skopeo makes goes through the egress proxy (an outside registry), to which addresses."""

    tls_verify: bool = True
    username: str = ""
    password: str = field(default="", repr=False)
    timeout_s: float = 30.0
    pinned_egress: bool = True  # False only for a pool's own registry, reached directly as it always was
    allow_private: bool = False  # what the proxy lets through: E31_ALLOW_PRIVATE_SOURCES


@dataclass(frozen=True)
class Cap:
    """The most an unpacked image (or a pull) may hold, and what sets that, as the failure names it ("more than
    {why}"): a figure only where the team may know it (never the cache's room, which other teams' data sets)."""

    bytes: int
    why: str


@dataclass(frozen=True)
class Resolved:
    digest: str  # the manifest the tag named at this moment: the image the job runs
    bytes: int  # what a pull moves: config and compressed layers


def resolve(ref: imageref.Reference, *, access: Access) -> Resolved:
    """The digest a reference names now and the bytes a pull moves; manifests only, no layer is fetched."""
    target = ref.pinned(ref.digest) if ref.digest else str(ref)
    raw = _inspect(target, access, "--raw")
    digest = ref.digest or "sha256:" + hashlib.sha256(raw).hexdigest()
    manifest = _manifest(raw)
    if manifest.get("mediaType") in INDEX_TYPES or "manifests" in manifest:
        instance = _platform_instance(manifest, ref)
        manifest = _manifest(_inspect(ref.pinned(instance), access, "--raw"))
    return Resolved(digest=digest, bytes=_pull_bytes(manifest))


@contextmanager
def _well_formed(what: str) -> Iterator[None]:
    """A registry's document of another shape than the spec's (not JSON, a list, a missing digest) fails the
    staging saying so: a bare ValueError or KeyError would escape the stager, and the reconciler would send
    the job back to staging every stale period, for ever."""
    try:
        yield
    except (ValueError, LookupError, AttributeError, TypeError) as exc:
        raise transfers.TransferFailed(what) from exc


def _manifest(raw: bytes) -> dict:
    with _well_formed(NOT_A_MANIFEST):
        manifest = json.loads(raw)
        if not isinstance(manifest, dict):
            raise TypeError("a manifest is a JSON object")
    return manifest


def _pull_bytes(manifest: dict) -> int:
    """The config's and the layers' declared sizes: whole numbers, none below 0 (a negative one would
    hide a layer's bytes from the room a pull is checked against)."""
    with _well_formed(NOT_A_MANIFEST):
        sizes = [manifest.get("config", {}).get("size", 0)]
        sizes += [layer.get("size", 0) for layer in manifest.get("layers", [])]
        if not all(type(size) is int and size >= 0 for size in sizes):
            raise ValueError("a size is a whole number of bytes")
    return sum(sizes)


def _platform_instance(index: dict, ref: imageref.Reference) -> str:
    with _well_formed(NOT_A_MANIFEST):
        for entry in index.get("manifests", []):
            wanted = entry.get("platform", {})
            if wanted.get("os") == "linux" and wanted.get("architecture") == ARCH:
                if not isinstance(entry["digest"], str):
                    raise TypeError("a digest is a string")
                return entry["digest"]
    raise transfers.TransferFailed(f"{ref} has no image for linux/{ARCH}")


# What skopeo writes beside the blobs the manifest declares: the manifest itself, index.json, oci-layout.
LAYOUT_SLACK = 2**20


def pull_limit(declared: int) -> "Cap | None":
    """The most a pull of an image whose manifest declares ``declared`` bytes may write (None: it declares none,
    as Docker's schema 1, and the caller's room bounds it)."""
    if not declared:
        return None
    return Cap(declared + LAYOUT_SLACK, f"the {format_size(declared)} the image's manifest declares")


def pull(
    ref: imageref.Reference, digest: str, layout: Path, *, access: Access, progress: transfers.Progress,
    floor: transfers.Floor | None = None, limit: "Cap | None" = None,
) -> int:  # fmt: skip
    """Copies the image by digest into the OCI layout ``layout``; returns the bytes that landed there.

    Blobs already in the layout are not fetched again (skopeo checks the layout first), so a retry
    after a dropped connection moves only what is missing. Past ``limit`` bytes skopeo is stopped
    (TransferFailed): the room and the caps were worked out from the sizes the manifest declares, and a
    registry may send more than it declares (skopeo writes what comes; umoci notices only when unpacking).
    """
    layout.parent.mkdir(parents=True, exist_ok=True)
    _remove_partial_blobs(layout)
    before = _tree_bytes(layout)
    args = ["copy", "--quiet", *_tls("--src-tls-verify", access), "docker://" + ref.pinned(digest),
            f"oci:{layout}:{LAYOUT_TAG}"]  # fmt: skip
    # Its errors go to a file, not a pipe: a pipe nobody reads until the end would stall skopeo once full.
    with (
        _skopeo_env(access, "--src-authfile", ref.registry) as (env, auth, refusals),
        tempfile.TemporaryFile() as err,
    ):
        proc = subprocess.Popen(
            ["skopeo", *args[:1], *auth, *args[1:]],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
        _follow(proc, layout, before, progress, floor, limit)
        if proc.returncode:
            raise _failure(_read_back(err), refusals, access)
    moved = _tree_bytes(layout) - before
    _check_limit(moved, limit)  # what landed after the last measure
    return moved


def _check_limit(moved: int, limit: "Cap | None") -> None:
    if limit is not None and moved > limit.bytes:
        raise transfers.TransferFailed(f"the registry sent more than {limit.why}: the pull was stopped")


def _remove_partial_blobs(layout: Path) -> None:
    """What a skopeo stopped mid-blob (a cancel, the floor) left: its temporary file, never renamed into place.
    A retry into the same layout would otherwise leave it in the cached image for good."""
    for leftover in layout.glob("oci-put-blob*"):
        leftover.unlink(missing_ok=True)


def _follow(
    proc: subprocess.Popen,
    layout: Path,
    before: int,
    progress: transfers.Progress,
    floor: transfers.Floor | None,
    limit: "Cap | None",
) -> None:
    """Reports the layout's growth while skopeo writes it; stops skopeo when progress says stop, when the
    registry sends slower than the floor (skopeo itself waits on a trickling registry for ever), or more than
    ``limit``."""
    pace = transfers.FloorWatch(floor, 0)

    def beat() -> None:
        grown = max(0, _tree_bytes(layout) - before)
        _check_limit(grown, limit)
        transfers.report(progress, grown)
        pace.passed(grown)

    _wait_beating(proc, beat)


def _wait_beating(
    proc: subprocess.Popen, beat: Callable[[], None], *, every_s: float = transfers.PROGRESS_EVERY_S
) -> None:
    """Waits for ``proc``, calling ``beat`` every ``every_s`` it still runs; whatever ``beat``
    raises (a cancel, a lost claim, a cap) kills the process first."""
    try:
        while True:
            try:
                proc.wait(timeout=every_s)  # returns the moment the process is done
                return
            except subprocess.TimeoutExpired:
                beat()
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def unpack(layout: Path, bundle: Path, *, beat: Callable[[], None], cap: Cap) -> None:
    """The layout's image as a root filesystem at ``bundle/rootfs``, stopped (TransferFailed) past ``cap``.

    ``--rootless`` even as root: files keep their owner (the stager) but not the image's, and no
    device node is made. umoci still restores the modes, so a setuid file or a world-writable folder
    of the image would be one on the node: ``_tame`` clears those bits before anything can use them.
    umoci reports no progress and a many-gigabyte image unpacks for minutes: ``beat`` is called
    while it runs (the stager's proof of life), and stops it by raising. A layer of a few KB may unpack
    to gigabytes (zeros compress a thousandfold): the bundle is measured while umoci writes it, and umoci
    killed once it holds more than ``cap``; what it wrote is the caller's to remove.
    """
    limit, beaten = _GrowthLimit(bundle, cap), time.monotonic()

    def beat_and_measure() -> None:
        nonlocal beaten
        if time.monotonic() - beaten >= transfers.PROGRESS_EVERY_S:
            beat()
            beaten = time.monotonic()
        limit.check()

    with tempfile.TemporaryFile() as err:  # a file, not a pipe, as for skopeo
        proc = subprocess.Popen(
            ["umoci", "unpack", "--rootless", "--image", f"{layout}:{LAYOUT_TAG}", str(bundle)],
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
        _wait_beating(proc, beat_and_measure, every_s=MEASURE_EVERY_S)
        if proc.returncode:
            raise transfers.TransferFailed(f"unpacking failed: {_last_line(_read_back(err))}")
    limit.check(whole=True)  # what umoci wrote after the last measure
    _tame(bundle / "rootfs")


class _GrowthLimit:
    """The bundle's bytes as umoci writes them, against the image's cap.

    Measured as the cache counts the entry once ready (``tree_bytes``: each file's size), so what the cap lets
    through is what the cache holds. ``shutil.disk_usage`` would be cheaper, but it sees the whole filesystem:
    every other fill, the agents' roots and checkpoints that share the disk, and a sweep's removals, so it can
    neither tell this image's growth nor bound it. What umoci writes between two walks is the overshoot.
    """

    def __init__(self, root: Path, cap: Cap) -> None:
        self.root, self.cap, self.next_at = root, cap, 0.0

    def check(self, *, whole: bool = False) -> None:
        began = time.monotonic()
        if began < self.next_at and not whole:
            return
        try:
            size = _tree_bytes(self.root)
        except OSError as exc:  # a folder the image made that the stager cannot list: its size is unknown
            raise transfers.TransferFailed(
                f"the unpacked image cannot be measured: {_unreadable(exc)}"
            ) from exc
        self.next_at = time.monotonic() + MEASURE_SPACING * (time.monotonic() - began)
        if size > self.cap.bytes:
            raise transfers.TransferFailed(
                f"the image unpacks to more than {self.cap.why}: unpacking stopped"
            )


UNSAFE_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_IWOTH


def _tame(rootfs: Path) -> None:
    """No setuid/setgid file and nothing writable by other users in an unpacked root, the root folder included
    (an image's / may be 0777), links untouched."""
    try:
        for path, status in ((os.fspath(rootfs), os.lstat(rootfs)), *trees.entries(rootfs)):
            if not stat.S_ISLNK(status.st_mode) and status.st_mode & UNSAFE_BITS:
                os.chmod(path, stat.S_IMODE(status.st_mode) & ~UNSAFE_BITS)
    except OSError as exc:  # never a root that was only partly tamed
        raise transfers.TransferFailed(f"the unpacked image cannot be checked: {_unreadable(exc)}") from exc


def _unreadable(exc: OSError) -> str:
    """What the image holds that the stager could not read, without the node's own path to it."""
    where = Path(exc.filename).name if exc.filename else "a folder"
    return f"{where!r}: {exc.strerror or exc}"


def image_config(layout: Path) -> dict:
    """Env, Entrypoint, Cmd and WorkingDir as the pulled image declares them, read from the layout."""
    with _well_formed("the image's configuration is not valid"):
        index = json.loads((layout / "index.json").read_text())
        manifest = json.loads(_blob(layout, index["manifests"][0]["digest"]))
        config = json.loads(_blob(layout, manifest["config"]["digest"])).get("config") or {}
        run = {key: config[key] for key in RUN_CONFIG if config.get(key)}
        if not all(_is_run_value(key, value) for key, value in run.items()):
            raise TypeError(
                "Env, Entrypoint and Cmd are lists of strings, WorkingDir a string, none holding a NUL"
            )
    return run


def _is_run_value(key: str, value) -> bool:
    """What the sandbox takes them for: the node would otherwise run a job with, say, each character of a
    string ``Env`` as a variable. Strings an argument list and the database's JSON can hold: no NUL, no half
    of a character (a lone surrogate)."""
    if key == "WorkingDir":
        return _is_text(value)
    return isinstance(value, list) and all(_is_text(item) for item in value)


def _is_text(value) -> bool:
    if not isinstance(value, str) or "\0" in value:
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _blob(layout: Path, digest: str) -> bytes:
    algorithm, _, hexdigest = digest.partition(":")
    return (layout / "blobs" / algorithm / hexdigest).read_bytes()


def tree_bytes(root: Path) -> int:
    return _tree_bytes(root)


# What each entry of a tree takes at the least: a block and an inode. Counted by file size alone, an image of 40,000
# empty folders held 168 MB and 40,000 inodes on disk while it counted 3.8 MB.
ENTRY_BYTES = 4096


def _tree_bytes(root: Path) -> int:
    """What the tree takes on disk: each entry (folder, link, file) at least ENTRY_BYTES, a file at least its size
    and its blocks (a temporary file renamed meanwhile is counted under its new name next time)."""
    return sum(
        max(ENTRY_BYTES, status.st_blocks * 512, status.st_size if stat.S_ISREG(status.st_mode) else 0)
        for _, status in trees.entries(root)
    )


def _inspect(target: str, access: Access, *flags: str) -> bytes:
    with _skopeo_env(access, "--authfile", target.split("/", 1)[0]) as (env, auth, refusals):
        try:
            done = subprocess.run(
                ["skopeo", "--command-timeout", f"{access.timeout_s:.0f}s", "inspect", *auth, *flags,
                 *_tls("--tls-verify", access), "docker://" + target],
                env=env, capture_output=True, timeout=access.timeout_s + 10,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise transfers.Transient(f"the registry did not answer within {access.timeout_s:.0f} s") from exc
    if done.returncode:
        raise _failure(done.stderr.decode("utf-8", "replace"), refusals, access)
    return done.stdout


def _tls(flag: str, access: Access) -> list[str]:
    return [f"{flag}={'true' if access.tls_verify else 'false'}"]


@contextmanager
def _skopeo_env(
    access: Access, flag: str, registry: str
) -> Iterator[tuple[dict[str, str], list[str], list[Exception]]]:
    """An empty home and an auth file of this pull's own (0600, removed after): never the node's login,
    and the password never on a command line where ``ps`` would show it. For an outside registry, an egress
    proxy for this call, and what it refused or could not reach (empty for a pool's own registry)."""
    with tempfile.TemporaryDirectory(prefix="e31-registry-") as home, _egress(access, registry) as proxy:
        auth = Path(home) / "auth.json"
        auths = {}
        if access.username:
            token = base64.b64encode(f"{access.username}:{access.password}".encode()).decode()
            auths = {"auths": {registry: {"auth": token}}}
        auth.write_text(json.dumps(auths))
        auth.chmod(0o600)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "XDG_RUNTIME_DIR": home,
               "XDG_CONFIG_HOME": home, "TMPDIR": home}  # fmt: skip
        if proxy is None:
            yield env, [f"{flag}={auth}"], []
        else:
            yield {**env, **proxy.environment()}, [f"{flag}={auth}"], proxy.problems


def _egress(access: Access, registry: str) -> AbstractContextManager[egress.Proxy | None]:
    """The egress proxy for an outside registry's call (None for a pool's own). Its ports: 443, where registries,
    their token services and their blob stores answer, and the one the reference names, so a redirect or a realm
    cannot reach another port of a host (a private one is refused whatever its port)."""
    if not access.pinned_egress:
        return nullcontext()
    _, colon, port = registry.rpartition(":")
    ports = {443, int(port)} if colon else {443}
    return egress.Proxy(ports=ports, allow_private=access.allow_private, timeout_s=access.timeout_s)


def _failure(stderr: str, refusals: list[Exception], access: Access) -> Exception:
    """What the egress proxy refused or could not reach, where it did: skopeo itself says only "Forbidden"
    (or "Bad Gateway"), which would also tell nothing of why. Where skopeo went around the proxy to a loopback
    address, one message whatever it met there: "connection refused", a 404 or a timeout would map the node's
    local ports for whoever runs the registry."""
    if refusals:  # a refusal for good before one worth retrying (too many connections at once, a slow lookup)
        return next((r for r in refusals if isinstance(r, transfers.TransferFailed)), refusals[0])
    if access.pinned_egress and not access.allow_private and _names_loopback(stderr):
        return transfers.TransferFailed(AROUND_THE_PROXY)
    return _classified(stderr)


def _names_loopback(text: str) -> bool:
    """Whether ``text`` names a URL on "localhost" or a loopback IP literal: the ones Go never proxies."""
    for url in URL_IN_TEXT.findall(text):
        try:
            host = urlsplit(url).hostname or ""
            if host == "localhost" or pinned.unwrapped(host).is_loopback:
                return True
        except ValueError:  # a host name, or a broken "[": not a loopback literal
            continue
    return False


def _classified(stderr: str) -> Exception:
    """The registry's own answer, permanent (missing, refused) or worth retrying (down, 5xx, timeout)."""
    message = _last_line(stderr)
    if any(marker in message.lower() for marker in PERMANENT):
        return transfers.TransferFailed(message)
    return transfers.Transient(message)


def _read_back(err) -> str:
    """What a process wrote to the file given as its stderr."""
    err.seek(0)
    return err.read().decode("utf-8", "replace")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[-1] if lines else "no answer"
    if 'msg="' in line:  # skopeo's log format: time=… level=fatal msg="…"
        line = line.split('msg="', 1)[1].rsplit('"', 1)[0]
    return line[:400]
