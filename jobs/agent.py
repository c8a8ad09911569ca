"""The node agent's work: run one part of an attempt, watch it, seal its outputs, deliver them.

An agent is a Celery worker on queue ``node.<name>`` (threads pool, one thread per running
part). Each part is watched once a second against the database: cancel, preemption, time limit,
a failed sibling on another node, or the allocation released under it (node declared down).
"""

import collections
import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from django.conf import settings
from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connections,
)

from accounts import team_secrets
from common import platform_services
from jobs import (
    attempt_space,
    cgroups,
    checkpoints,
    clock,
    devices,
    image_staging,
    leftovers,
    limits,
    logs,
    masking,
    network,
    nodes,
    rental,
    sandbox,
    trees,
)
from jobs.lifecycle import PREEMPTED, EndReason, State
from jobs.models import Allocation, ImagePull, Job, Node
from jobs.rental import STOPPED
from jobs.units import format_size

log = logging.getLogger(__name__)
_E = TypeVar("_E", bound=BaseException)


class AttemptSpaceUnbounded(RuntimeError):
    """The node promised bounded attempt space and could not give it: the attempt ends, released."""


class GpusStillStopping(RuntimeError):
    """A GPU of the part is still used by a process of this node's that is stopping (its part released while it
    ran: its node declared lost while this agent lived, or set down and up again): the part goes back to the queue."""


class LocalGpus:
    """Which of this node's GPUs a process of this agent uses, until that process is gone.

    The platform frees a part's GPUs when it releases the part, which for a part stopped from outside comes
    before its process has stopped (the TERM, then up to ``E31_KILL_GRACE_S``): a part rented onto them meanwhile
    waits here, so two jobs never run on one GPU at once."""

    def __init__(self) -> None:
        # (node, GPU index) -> the allocation whose process uses it: one process may run several nodes' agents
        self.users: dict[tuple[str, int], int] = {}
        self.changed = threading.Condition()

    @contextlib.contextmanager
    def using(self, node: str, indices: Sequence[int], allocation_id: int, *, wait_s: float):
        deadline, gpus = time.monotonic() + wait_s, [(node, i) for i in indices]
        with self.changed:
            while busy := {g: self.users[g] for g in gpus if g in self.users}:
                if (left := deadline - time.monotonic()) <= 0:
                    named = ", ".join(f"GPU {i} (allocation {a})" for (_, i), a in sorted(busy.items()))
                    raise GpusStillStopping(f"{named} still in use by a process that is stopping")
                self.changed.wait(left)
            self.users.update(dict.fromkeys(gpus, allocation_id))
        try:
            yield
        finally:
            with self.changed:
                for g in gpus:
                    self.users.pop(g, None)
                self.changed.notify_all()


LOCAL_GPUS = LocalGpus()


def _gpu_wait_s() -> float:
    """Long enough for a released part's process to see its release, get TERM, its kill grace, and be reaped."""
    return 2 * settings.E31_KILL_GRACE_S + 2 * CHECK_EVERY_S


TAIL_BYTES = 8 * 1024
# Past its log's cap a job's output is only kept for the tail, read at this pace: the pipe then holds the job's
# writes back. Read at full speed, a job printing 1.4 GB/s cost its agent 6.5 s of CPU every 10 s, taken from
# every other part of the node; at 8 MiB/s, 3.5 % of a core (90 MB printed with a secret masked, 10.7 s). At
# 256 KB/s a job printing 26 MB in 0.16 s was held back 37 s, metered, and timed out.
POST_CAP_BYTES_PER_S = 8 * 1024 * 1024
POLL_S = 0.2
CHECK_EVERY_S = 1.0
# The most of a part's log one shipment carries: on a slow link a whole capped log (10 MB) took seconds, and
# no stop check ran meanwhile.
SHIP_PIECE_BYTES = 256 * 1024
SHIP_WAIT_S = 5.0  # what a part's last shipment waits for one under way before it is released without it
SEEN_EVERY_S = 5.0
# The longest a part's clean-up after its exit is reported alive on a timer (sync and fstrim of an attempt space
# sized for up to E31_MAX_OUTPUT_BYTES, its output tree given back file by file): past it, a clean-up is taken for
# hung (a disk that no longer answers), and the reconciler releases the part as it would a silent agent's, rather
# than leave its GPUs held and metered for ever.
AFTER_EXIT_BEATS_S = 3600.0
# The same for its preparation, from its start until its process runs (its attempt space made and mounted, its
# team's secrets read, its GPUs waited for, its network wired): seconds, unless a mount or the database hangs.
PREPARATION_BEATS_S = 600.0
MAX_PATH = 1024  # an output file's path, as the manifest row holds it
# Stopped by its agent: its node was cut off from the database too long to be sure its GPUs are still its own.
FENCED = "fenced"


class LogCapture(threading.Thread):
    """Drains the job's output into a capped log file, keeps a rolling tail for the job page, and holds
    what is not yet shipped to the database (``unshipped``), so the whole log outlives the attempt dir."""

    def __init__(self, stream, path: Path, cap: int, secrets: dict[str, str] | None = None) -> None:
        super().__init__(daemon=True)
        self.stream, self.path, self.cap = stream, path, cap
        self.mask = masking.SecretMask(secrets or {})  # before anything is kept: file, tail, database
        self.tail: collections.deque[bytes] = collections.deque()
        self.tail_size = 0
        self.lines = 0  # newlines seen in the whole output, so the tail can say how many lines it left out
        self.written = 0
        self.capped = False  # the cap was reached: the rest is discarded, here and in the database
        self.file_full = False  # a write to job.log failed: the file stops, the database log does not
        self.lock = threading.Lock()
        self.shipping = threading.Lock()
        self.unshipped = bytearray()
        self.shipped = 0

    def run(self) -> None:
        out = self.path.open("wb")
        try:
            for chunk in iter(lambda: self.stream.read1(65536), b""):
                self._keep(out, self.mask.feed(chunk))
                if self.capped:
                    time.sleep(len(chunk) / POST_CAP_BYTES_PER_S)
            self._keep(out, self.mask.flush())
        finally:
            with contextlib.suppress(OSError):  # the last flush onto a full space: the database has it all
                out.close()

    def _keep(self, out, chunk: bytes) -> None:
        if not chunk:
            return
        self._keep_tail(chunk)
        self._capped_write(out, chunk)

    def _capped_write(self, out, chunk: bytes) -> None:
        room = self.cap - self.written
        if room > 0:
            self._write(out, chunk[:room])
            self.written += min(room, len(chunk))
        if len(chunk) > room and not self.capped:  # the note goes exactly where the log was cut
            self.capped = True
            self._write(out, f"\n[log capped at {self.cap} bytes; further output discarded]\n".encode())

    def _write(self, out, data: bytes) -> None:
        with self.lock:  # kept for the database first: a full attempt disk does not lose it there
            self.unshipped += data
        if self.file_full:
            return
        try:
            out.write(data)
        except (
            OSError
        ):  # the job filled its own space (job.log lives there): the file ends, the database log goes on
            self.file_full = True

    def ship(self, send, *, limit: int | None = None, wait_s: float = -1) -> bool:
        """Calls ``send(offset, data)`` with what is not shipped yet (at most ``limit`` bytes); kept for the next
        try if it raises. Whether more is left. One shipment at a time (the watcher's, then the part's last): two
        would drop the same bytes twice. ``wait_s``: how long to wait for one under way (-1: as long as it takes);
        past it nothing is shipped."""
        if not self.shipping.acquire(timeout=wait_s):
            return bool(self.unshipped)
        try:
            with self.lock:
                offset, data = self.shipped, bytes(self.unshipped[:limit])
            if data:
                send(offset, data)
            with self.lock:
                del self.unshipped[: len(data)]
                self.shipped += len(data)
                return bool(self.unshipped)
        finally:
            self.shipping.release()

    def _keep_tail(self, chunk: bytes) -> None:
        self.lines += chunk.count(b"\n")
        self.tail.append(chunk)
        self.tail_size += len(chunk)
        while self.tail_size - len(self.tail[0]) >= TAIL_BYTES:
            self.tail_size -= len(self.tail.popleft())

    def text(self) -> str:
        note = (
            f"[log capped at {self.cap} bytes; the tail below is the latest output]\n" if self.capped else ""
        )
        return note + whole_lines_tail(b"".join(self.tail), lines=self.lines)


def whole_lines_tail(data: bytes, *, lines: int) -> str:
    """The last TAIL_BYTES of ``data`` from a line's start, under a note counting the lines left out above
    (``lines`` counts every newline of the whole output, ``data`` being its end)."""
    if len(data) <= TAIL_BYTES and data.count(b"\n") == lines:
        return data.decode("utf-8", "replace")  # the whole output: nothing left out
    start = data.find(b"\n", max(len(data) - TAIL_BYTES - 1, 0)) + 1  # the first line start in the window
    kept = data[start:] if 0 < start < len(data) else data[-TAIL_BYTES:]  # one line longer than it: its end
    earlier = lines - kept.count(b"\n")
    return f"… {earlier} earlier line{'' if earlier == 1 else 's'}\n" + kept.decode("utf-8", "replace")


@dataclass(frozen=True)
class Part:
    allocation: Allocation
    job: Job
    rank: int
    num_nodes: int
    coordinator: str  # where rank 0 listens; "" for a job on one node (it is told none)
    key: str  # names this part's namespace, links and groups on the host
    visible_devices: str  # CUDA_VISIBLE_DEVICES
    network: network.PartNetwork | None  # spanning nodes or with egress, sandboxed: its own wired namespace
    num_gpus: int = 0  # GPUs the attempt holds on all its nodes (elastic: fewer or more than declared)
    network_note: str = ""  # what the job page says of its network


def run_part(
    *,
    allocation_id: int,
    mode: str,
    uids: sandbox.UidRange | None,
    gpu_uuids: Mapping[int, str] | None = None,
    node_name: str | None = None,
) -> None:
    """Runs one allocation's process to its end, then finishes, seals and (last part) releases. ``node_name``: the
    node this agent serves; an allocation of another node is not started here."""
    if not rental.start_allocation(allocation_id=allocation_id, now=clock.now(), node_name=node_name):
        # A duplicate delivery, released before it could start, or another node's part (a misrouted message).
        return
    try:
        part = _with_database(lambda: _load_part(allocation_id, mode, gpu_uuids))
    except Exception as exc:  # nothing ran: the GPUs must not stay held (and metered) with no process
        log.exception("allocation %s: the part could not be prepared", allocation_id)
        detail = _agent_fault("the node agent could not prepare it", exc, allocation_id)
        _with_database(lambda: _release_unprepared(allocation_id, detail))
        return
    dirs = _with_checkpoint(part, sandbox.attempt_dirs(part.allocation))
    # Until its process runs, and from its exit until the exit is recorded (the output tree given back to the
    # agent, the checkpoint settled, the attempt space flushed), minutes can pass with no watcher to say so.
    preparing = QuietBeats(part, "preparing it", limit_s=PREPARATION_BEATS_S)
    after_exit = QuietBeats(part, "cleaning up after its exit", limit_s=AFTER_EXIT_BEATS_S)
    preparing.start()
    try:
        _run_to_the_end(part, dirs, mode, uids, preparing, after_exit)
    finally:
        preparing.stop()
        after_exit.stop()


def _run_to_the_end(
    part: Part,
    dirs: sandbox.AttemptDirs,
    mode: str,
    uids: sandbox.UidRange | None,
    preparing: "QuietBeats",
    after_exit: "QuietBeats",
) -> None:
    allocation_id = part.allocation.id
    uid, ran = None, False
    # How a part that never reached its exit ends: run once its attempt has settled, since a job released or
    # requeued can be placed again at once, on this node too, and must not find this attempt still tidying up.
    ending = None
    try:  # everything after the start is inside: whatever fails, the GPUs are released
        _bound_or_refuse(part, dirs)  # created mounted: the job's files live in its bounded space
        secrets = _with_database(lambda: _secrets_for(part.job))
        uid = uids.take(allocation_id) if uids and os.geteuid() == 0 else os.getuid()
        with LOCAL_GPUS.using(
            part.allocation.node.name, part.allocation.gpu_indices, allocation_id, wait_s=_gpu_wait_s()
        ):
            outcome, exit_code = _confined_run(
                part, dirs, mode, uid, secrets, launching=preparing.stop, exited=after_exit.start
            )
        ran = True
    except team_secrets.SubmitterGone as exc:  # a kind of SecretsUnavailable, told in its own words
        ending = functools.partial(
            _release_failed, part, f"not started, handed none of the team's secrets: {exc}"
        )
    except team_secrets.SecretsUnavailable as exc:  # names only, never a value
        ending = functools.partial(_release_failed, part, f"secrets: {exc}")
    except GpusStillStopping as exc:
        ending = functools.partial(_requeue_while_stopping, part, exc)
    except Exception as exc:  # never leave GPUs held
        if (no_room := _raised_during(exc, attempt_space.NoRoom)) is not None:
            if no_room is not exc:  # a clean-up step failed on top of it: the shortage is still the node's
                log.error("allocation %s: cleaning up after no room failed", allocation_id, exc_info=exc)
            ending = functools.partial(_requeue_for_room, part, no_room)
        else:  # the agent itself failed
            log.exception("allocation %s: the agent failed", allocation_id)
            ending = functools.partial(
                _release_failed, part, _agent_fault("the node agent failed", exc, allocation_id)
            )
    finally:
        try:
            kept = (
                _settle_checkpoint(part) if dirs.checkpoint else None
            )  # before its uid can go to another attempt
            if uids and uid is not None:
                uids.give_back(uid)
            _settle_space(dirs, ran=ran)
        finally:  # also when settling raised: the GPUs are released all the same
            if ending is not None:
                ending()
    if ending is not None:
        return
    if kept is not None:
        _with_database(lambda: rental.note_checkpoint(job_id=part.job.id, attempt=part.allocation.attempt,
                                                      held_bytes=kept.bytes, note=kept.note, now=clock.now()))  # fmt: skip
    try:
        _with_database(lambda: _after_exit(part, dirs, outcome, exit_code, recorded=after_exit.stop))
    except Exception as exc:  # between the exit and the seal: without this the attempt would hold its GPUs
        log.exception("allocation %s: the agent failed after the job's exit", allocation_id)
        detail = _agent_fault("the node agent failed sealing the outputs", exc, allocation_id)
        _with_database(lambda: _release_failed(part, detail))
    if dirs.checkpoint:
        _with_database(lambda: remove_ended_checkpoints(job_ids=[part.job.id]))


def _give_back(root: Path) -> None:
    """The attempt's files the agent's, for the seal. A tree nested past what the walk recurses (about a thousand
    levels) is given back as far as it goes: its processes are gone by now, so the rest can change no more, and the
    seal, which walks as deep, refuses it as the job's own outcome ("nests its folders too deep")."""
    try:
        sandbox.reown(root)
    except RecursionError:
        log.info("%s nests its folders past what a walk recurses: the seal refuses it", root)


def _secrets_for(job: Job) -> dict[str, str]:
    """The team's secrets the job declared, decrypted only now, for the attempt this agent has just started, and
    held in memory only; SubmitterGone when whoever submitted it may no longer act for the team.

    Checked for every attempt, secrets declared or not: the job runs on the team's GPUs, budget, data and outputs
    too. Removing a member cancels its jobs that hold no GPUs yet; this catches the rest: one placed while the
    removal committed, one requeued after it, and every job of an account deactivated since it was queued."""
    team_secrets.check_submitter(team_id=job.team_id, user_id=job.submitted_by_id)
    return team_secrets.values_for_attempt(team_id=job.team_id, declared=job.secrets)


def _agent_fault(what: str, exc: BaseException, allocation_id: int) -> str:
    """What a team reads when the agent itself failed, and where operators find the rest: the error as the
    agent's own code words it, but never the file names or command lines of the node's own (an OSError's, a
    failed command's), which stay in the node's log."""
    if isinstance(exc, subprocess.CalledProcessError):
        said = f"a command on the node exited {exc.returncode}"
    elif isinstance(exc, OSError):
        said = exc.strerror or type(exc).__name__
    else:
        said = str(exc) or type(exc).__name__
    return f"{what}: {said} (the node's log has it under allocation {allocation_id})"


def _raised_during(exc: BaseException, kind: type[_E]) -> _E | None:
    """``exc`` or the exception it was raised while handling (a clean-up step failing after it), of ``kind``."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__context__
    return None


def _settle_checkpoint(part: Part) -> checkpoints.Kept | None:
    """The checkpoint back from the attempt, measured and unmounted; untouched once a newer attempt has it
    (this part's node was declared lost while it still ran, and the job went on elsewhere)."""
    job = part.job
    if not _with_database(lambda: Job.objects.filter(id=job.id, attempt=part.allocation.attempt).exists()):
        return None
    try:
        return checkpoints.settle(job.id, limit=job.checkpoint_bytes)
    except Exception as exc:  # never leave the GPUs held for it: the job resumes from scratch instead
        log.exception("allocation %s: its checkpoint could not be settled", part.allocation.id)
        checkpoints.remove(job.id)
        return checkpoints.Kept(0, f"its checkpoint could not be handed on ({exc}) and was removed"[:300])


def _with_checkpoint(part: Part, dirs: sandbox.AttemptDirs) -> sandbox.AttemptDirs:
    """A pausable job's first part is handed its checkpoint directory (the other parts keep their own files)."""
    if not (part.job.checkpoints and part.rank == 0):
        return dirs
    return dataclasses.replace(dirs, checkpoint=checkpoints.directory(part.job.id))


def _settle_space(dirs: sandbox.AttemptDirs, *, ran: bool) -> None:
    """A run that ended keeps its outputs and log for sealing and delivery; its scratch (``work``) goes, and
    everything it left unused goes back to the node's disk. An attempt that never ran its job, or whose agent
    failed, delivers nothing: its whole space goes now. Never at the retention sweep, a day later: a job of a
    second that fills its scratch must not hold the node's disk for a day."""
    try:
        if ran:
            try:
                trees.remove_tree(dirs.work)
            finally:  # what it could not remove (a timeout on millions of files) keeps its blocks; the rest goes
                attempt_space.give_back_unused(dirs.root)
        else:
            attempt_space.release(dirs.root)
    except (OSError, subprocess.SubprocessError):  # the retention sweep tries again
        log.exception("attempt space %s could not be given back", dirs.root)


def _release_failed(part: Part, detail: str) -> None:
    _release_unprepared(part.allocation.id, detail, node=part.allocation.node.name)


def _release_unprepared(allocation_id: int, detail: str, *, node: str = "") -> None:
    """Releases the part as failed (nothing of it runs); ``node``: its name, read here when not known."""
    node = node or Allocation.objects.values_list("node__name", flat=True).get(id=allocation_id)
    rental.release_part(allocation_id=allocation_id, end_reason=EndReason.FAILED, now=clock.now(),
                        actor=rental.agent_actor(node), detail=detail[:300])  # fmt: skip


def _requeue_for_room(part: Part, exc: attempt_space.NoRoom) -> None:
    """A disk could not hold the attempt's space (or its checkpoint's): the job goes back to the queue
    while it has attempts left (another node's disk may have room). Nothing of it ran.

    Only a node whose disk is too full for any attempt (not even one with no declared output) takes no new work
    for a while, so that the next job is not handed straight back to it. A disk that still has room for smaller
    spaces is not held for a large one: else one tenant's declarations could take node after node out of the pool,
    attempt after attempt. Nor is the node held for a full checkpoint store, which may be shared by every node."""
    log.warning("allocation %s: %s; %s bytes free", part.allocation.id, exc, f"{exc.free:,}")
    detail = f"no room on {exc.store}: {exc}"
    if exc.larger_than_disk:
        detail += f"; {exc.store} holds {format_size(exc.disk)} in all"
    full = exc.store == attempt_space.NODE_DISK and exc.free < limits.space_bytes(0)
    if full:  # before the job is placed again
        nodes.hold_for_room(node_id=part.allocation.node_id, now=clock.now())
    rental.release_part(allocation_id=part.allocation.id, end_reason=rental.NO_ROOM, now=clock.now(),
                        actor=_actor(part), detail=detail[:300])  # fmt: skip


def _requeue_while_stopping(part: Part, exc: GpusStillStopping) -> None:
    """Back to the queue, spending none of the job's attempts; the node takes no new work for a while (a process
    that outlives its kill grace is one the kernel cannot stop), so the job is not handed straight back to it."""
    log.warning("allocation %s: %s", part.allocation.id, exc)
    nodes.hold_for_room(node_id=part.allocation.node_id, now=clock.now())
    gpus = ", ".join(map(str, part.allocation.gpu_indices))
    detail = f"not started: GPU {gpus} of {part.allocation.node.name} was still in use by a process that was stopping"
    rental.release_part(allocation_id=part.allocation.id, end_reason=rental.GPU_BUSY, now=clock.now(),
                        actor=_actor(part), detail=detail[:300])  # fmt: skip


def _bound_or_refuse(part: Part, dirs: sandbox.AttemptDirs) -> None:
    """Bounds the attempt's space; a node that advertises a disk bound never runs a job without one."""
    if limits.bound_space(dirs.root, part.job) or limits.DISK_BOUNDED not in part.allocation.node.limits:
        return
    raise AttemptSpaceUnbounded(
        f"this node advertises a disk bound but could not mount one for {part.job.output_bytes} bytes of output"
    )


def _confined_run(
    part: Part,
    dirs: sandbox.AttemptDirs,
    mode: str,
    uid: int,
    secrets: dict[str, str],
    *,
    launching: Callable[[], None] = lambda: None,
    exited: Callable[[], None] = lambda: None,
) -> tuple[str, int | None]:
    """The part under its own uid, with its GPUs only, in its own network; then its files are the agent's.
    ``launching`` is called as its process is about to start, ``exited`` once it is gone, before the clean-up."""
    sandboxed = mode == sandbox.BUBBLEWRAP
    gpus = devices.gpu_nodes(settings.E31_DEVICE_ROOT, part.allocation.gpu_indices) if sandboxed else ()
    # Whatever fails from here (a checkpoint space the disk cannot hold too), nothing of it stays behind: each
    # step's undoing is registered before the step, and they all run, in reverse, even when one of them fails.
    with contextlib.ExitStack() as cleanup:
        # Last: sealing and delivery read files no job process can change any more.
        cleanup.callback(_give_back, dirs.root)
        cleanup.callback(devices.release, part.key)
        device_procs = devices.constrain(part.key, gpus) if sandboxed else None
        dirs.create(owner=uid)
        if dirs.checkpoint:
            checkpoints.prepare(part.job.id, owner=uid, limit=part.job.checkpoint_bytes)
            if not checkpoints.bounded(part.job.id) and limits.DISK_BOUNDED in part.allocation.node.limits:
                raise AttemptSpaceUnbounded(
                    "this node advertises a disk bound but could not mount one for the checkpoint"
                )
        sandbox.write_identity(dirs, uid=uid, gid=uid)
        if part.network:
            cleanup.callback(network.unwire, part.network)  # safe when nothing, or only part of it, was wired
            network.wire(part.network)
        rental.note_network(allocation_id=part.allocation.id, network=part.network_note)
        group = limits.open_group(part.allocation)
        cleanup.callback(group.remove)  # whatever of the job is still alive goes with its groups
        confinement = sandbox.Confinement(
            uid=uid, gid=uid, netns=part.network.namespace if part.network else "", devices=gpus,
            cgroup_procs=(*group.procs_files(), *([str(device_procs)] if device_procs else [])),
            libraries=devices.driver_libraries() if gpus else (),
        )  # fmt: skip
        return _run_bounded(part, dirs, mode, confinement, group, secrets, launching, exited)


def _load_part(allocation_id: int, mode: str, gpu_uuids: Mapping[int, str] | None) -> Part:
    allocation = Allocation.objects.select_related("node", "job__team").get(id=allocation_id)
    siblings = list(
        Allocation.objects.filter(job_id=allocation.job_id, attempt=allocation.attempt)
        .select_related("node")
        .order_by("rank")
    )
    # Names on the host (network namespace, links, groups): the node's next agent finds them by it if this one dies.
    key = leftovers.part_key(allocation.node.name, allocation.id)
    visible = devices.visible_devices(allocation.gpu_indices, gpu_uuids or {})
    first = siblings[0]
    held = sum(len(s.gpu_indices) for s in siblings)
    sandboxed = mode == sandbox.BUBBLEWRAP
    platform, refused = _egress(allocation, sandboxed)
    egress = platform is not None
    # Only a job spanning nodes is told where its first part is: a one-node job is never handed a platform address.
    spanning = len(siblings) > 1
    if (not spanning and not egress) or not sandboxed:
        coordinator = (first.node.address or first.node.name) if spanning else ""
        note = network.describe(None, sandboxed=sandboxed) + refused
        return Part(
            allocation, allocation.job, allocation.rank, len(siblings), coordinator, key, visible, None,
            num_gpus=held, network_note=note,
        )  # fmt: skip
    subnet = settings.E31_JOB_SUBNET
    wired = network.plan(subnet=subnet, key=key, slot=allocation.node.network_slot, gpu_indices=allocation.gpu_indices,
                         peers=[(s.node.network_slot, s.gpu_indices) for s in siblings], egress=egress,
                         platform=platform or (), resolvers=network.node_resolvers())  # fmt: skip
    coordinator = (
        network.part_addresses(subnet, first.node.network_slot, first.gpu_indices)[1] if spanning else ""
    )
    note = network.describe(wired, sandboxed=True) + refused
    return Part(
        allocation, allocation.job, allocation.rank, len(siblings), coordinator, key, visible, wired,
        num_gpus=held, network_note=note,
    )  # fmt: skip


def _egress(allocation: Allocation, sandboxed: bool) -> tuple[list[str] | None, str]:
    """(the platform's networks this part's internet access denies, or None where it has none; why none though
    its team may): read as the attempt starts."""
    if not (sandboxed and allocation.job.team.egress_allowed):
        return None, ""
    if allocation.node.multi_node_refusal:  # the node cannot wire a namespace of its own for a part
        return (
            None,
            f" (its team may reach the internet, but this node cannot wire it: {allocation.node.multi_node_refusal})",
        )
    try:
        return _platform_networks(), ""
    except PlatformUnresolved as exc:
        # Fails closed: a platform address missing from the deny list would be reachable for the whole run. The
        # team is told that much; which of the platform's hosts it was is the operators' (the log), not the job's.
        log.warning("part %s: no internet access wired: %s", allocation.id, exc)
        return (
            None,
            " (its team may reach the internet, but it was not wired: a platform address could not be looked up)",
        )


class PlatformUnresolved(OSError):
    """A platform host did not resolve as a part started, so its address could not be denied."""


def _platform_networks() -> list[str]:
    """The platform's own addresses a job with egress never reaches, even public ones: E31_EGRESS_DENY,
    and where the database (each host of a multi-host setting), every broker, cache location and the mail relay,
    the console, the pool's registries and every node not down resolve to. PlatformUnresolved when the host of a
    service every node uses does not resolve; a node's, the cache's or the mail relay's that does not is left out
    (a name only its own machine, or only the console's, knows), as are IPv6 addresses: a part's namespace has no
    IPv6."""
    services = {
        *platform_services.hosts(required=True),
        urlsplit(settings.E31_CONSOLE_URL).hostname or "",
        *(urlsplit(f"//{address}").hostname or "" for address in settings.E31_POOL_REGISTRIES),
    }
    live_nodes = Node.objects.exclude(address="").exclude(state=Node.NodeState.DOWN)
    nodes = {
        urlsplit(f"//{address}").hostname or "" for address in live_nodes.values_list("address", flat=True)
    } | set(platform_services.hosts(required=False))
    found = list(settings.E31_EGRESS_DENY)
    for host in _hosts(services):
        if (addresses := _ipv4_of(host)) is None:
            raise PlatformUnresolved(f"the platform's host {host} did not resolve")
        found += addresses
    for host in _hosts(nodes - services):
        if (addresses := _ipv4_of(host)) is None:
            log.warning("%s did not resolve: not denied to parts with internet access", host)
        found += addresses or []
    return found


def _hosts(names: set[str]) -> list[str]:
    """Host names and addresses, in order; a name starting with / is a Unix socket's folder (libpq's), and the
    sandbox gives jobs no host sockets."""
    return sorted(name.strip() for name in names if name.strip() and not name.strip().startswith("/"))


def _ipv4_of(host: str) -> list[str] | None:
    """``host``'s IPv4 addresses as /32 networks ([] for a host with IPv6 ones only); None if it did not resolve."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return None
    return sorted({f"{info[4][0]}/32" for info in infos if info[0] == socket.AF_INET})


def _run_bounded(part: Part, dirs: sandbox.AttemptDirs, mode: str, confinement: sandbox.Confinement,
                 group: cgroups.AttemptGroup, secrets: dict[str, str], launching: Callable[[], None] = lambda: None,
                 exited: Callable[[], None] = lambda: None) -> tuple[str, int | None]:  # fmt: skip
    image = _image(part)
    env = _job_env(part, sandbox.seen_inside(dirs, image), image, confinement.libraries)
    # Released (its node set down, or lost), cancelled or preempted while it was prepared: nothing of it may run, or
    # it would run after its RELEASE, unmetered, on GPUs that may already be another team's.
    if stop := _with_database(lambda: rental.stop_reason(allocation_id=part.allocation.id, now=clock.now())):
        exited()
        return stop, None
    launching()  # from here its watcher says it is alive
    try:
        proc = _launch(part, dirs, mode, confinement, env, secrets, image)
    except OSError as exc:  # unsandboxed and the program does not exist
        exited()
        (dirs.root / "job.log").write_text(f"could not start {part.job.argv[0]!r}: {exc}\n")
        _store_tail(part, f"could not start {part.job.argv[0]!r}: {exc}")
        _ship_log(part, 0, f"could not start {part.job.argv[0]!r}: {exc}\n".encode())
        return EndReason.FAILED, 127
    capture = LogCapture(proc.stdout, dirs.root / "job.log", settings.E31_LOG_CAP_BYTES, secrets)
    capture.start()
    stop, code = _supervise(part, proc, capture, mode, exited)
    capture.join(timeout=5)
    _with_database(lambda: _store_tail(part, capture.text()))
    # A late check of the watcher still shipping (its query swallowed by the network) must not hold the release up.
    if _with_database(
        lambda: capture.ship(lambda offset, data: _ship_log(part, offset, data), wait_s=SHIP_WAIT_S)
    ):
        log.warning(
            "allocation %s: a shipment of its log is stuck; the rest of its log stays on the node",
            part.allocation.id,
        )
    if stop:
        return stop, code
    if code == 0:
        return EndReason.SUCCEEDED, code
    # Read from the cgroup's own counter: a job that dies of SIGKILL is not assumed to be out of memory.
    return (EndReason.OUT_OF_MEMORY if group.oom_kills() else EndReason.FAILED), code


def _supervise(
    part: Part,
    proc: subprocess.Popen,
    capture: LogCapture,
    mode: str,
    exited: Callable[[], None] = lambda: None,
) -> tuple[str, int]:
    """Watches the part's process to its end, or stops it early; (why it was stopped or '', its exit code).
    The watcher's checks go on until the process is gone, through a checkpoint's grace too; then ``exited`` is
    called, which reports the part alive through the clean-up that follows."""
    watcher = Watcher(part, capture)
    watcher.start()
    try:
        stop = _watch(proc, watcher)
        # Children that outlived the job go with its process group, while its unreaped pid still pins that group.
        code = _stop(proc, stop, part, mode, cut_short=watcher.hurried) if stop else sandbox.reap(proc)
        if stop == PREEMPTED and watcher.latest == EndReason.TIMED_OUT:
            stop = (
                EndReason.TIMED_OUT
            )  # its hours ran out in the grace: it ends, not requeued for a fresh limit
    finally:
        watcher.finish()
        exited()
    return stop, code


def _stop(
    proc: subprocess.Popen, reason: str, part: Part, mode: str, cut_short: Callable[[], bool] = lambda: False
) -> int:
    """A pausable job stopped to be resumed gets its own signal and grace to checkpoint; any other stop, TERM.
    A checkpoint's grace is cut short (TERM, then ``E31_KILL_GRACE_S``) once ``cut_short`` says so: the job was
    cancelled meanwhile (its checkpoint goes with it), or its GPUs may no longer be its own."""
    if reason == PREEMPTED and part.job.checkpoints:
        sig = getattr(signal, f"SIG{part.job.checkpoint_signal}")
        return sandbox.terminate(
            proc, grace_s=part.job.checkpoint_grace_s, mode=mode, sig=sig, cut_short=cut_short,
            short_grace_s=settings.E31_KILL_GRACE_S,
        )  # fmt: skip
    return sandbox.terminate(proc, grace_s=settings.E31_KILL_GRACE_S, mode=mode)


def _launch(part: Part, dirs: sandbox.AttemptDirs, mode: str, confinement: sandbox.Confinement,
            env: dict[str, str], secrets: dict[str, str], image: sandbox.ImageView | None) -> subprocess.Popen:  # fmt: skip
    """Starts the part; its secrets reach bubblewrap through an inherited descriptor, never its argv or environment."""
    if mode != sandbox.BUBBLEWRAP:  # no sandbox: the job's own environment is the only place left
        cmd = sandbox.command(argv=part.job.argv, env=env, dirs=dirs, workdir=part.job.workdir, mode=mode,
                              confinement=confinement, image=image)  # fmt: skip
        return sandbox.launch(cmd, env={**env, **secrets}, cwd=dirs.work, mode=mode, confinement=confinement)
    fd = sandbox.secret_arguments(secrets) if secrets else None
    try:
        cmd = sandbox.command(argv=part.job.argv, env=env, dirs=dirs, workdir=part.job.workdir, mode=mode,
                              confinement=confinement, image=image, secrets_fd=fd)  # fmt: skip
        return sandbox.launch(cmd, env=env, cwd=dirs.work, mode=mode, confinement=confinement,
                              pass_fds=(fd,) if fd is not None else ())  # fmt: skip
    finally:
        if fd is not None:
            os.close(fd)


def _watch(proc: subprocess.Popen, watcher: "Watcher") -> str:
    """Waits for the process; returns why it must be stopped early, or '' once it has exited.

    The database checks run on the ``watcher``'s thread: a check the network swallowed (no error, no answer, for
    as long as TCP waits) holds that thread, never this loop. A database that is restarting does not stop the
    job: the checks resume when it is back. One out of reach for longer than ``fence_after_s`` does
    (``FENCED``): the platform may be declaring this node lost and giving the job's GPUs to its next attempt,
    which must never run beside this one.
    """
    while not sandbox.exited(proc):
        if watcher.reason:
            return watcher.reason
        if watcher.fenced():
            return FENCED
        time.sleep(POLL_S)
    return ""


class Watcher(threading.Thread):
    """The part's database checks, every CHECK_EVERY_S on a thread of their own, from the start of its process until
    it has stopped (a checkpoint's grace included, so the reconciler never takes a job saving its checkpoint for
    silent): first whether it must stop, then its log and its signs of life. On the part's own connection, shared:
    the part's thread touches the database only once the watcher has finished, or on a connection of its own when
    a check outlives ``finish`` (the network swallowed it, or the database is that slow)."""

    def __init__(self, part: Part, capture: LogCapture) -> None:
        super().__init__(name="part-watcher", daemon=True)
        self.part, self.capture = part, capture
        self.connection = connections[DEFAULT_DB_ALIAS]
        self.reached = time.monotonic()  # when a stop check last answered
        self.reason = ""  # the first reason to stop
        self.latest = ""  # the last check's: a cancel may follow a preemption
        self.done = threading.Event()
        self.handover = threading.Lock()
        self.exited = self.orphaned = False
        self.connection.inc_thread_sharing()

    def run(self) -> None:
        connections[DEFAULT_DB_ALIAS] = self.connection
        next_seen = 0.0
        try:
            while True:
                tick = time.monotonic()
                seen = tick >= next_seen
                if self._check(tick, seen=seen) and seen:
                    next_seen = tick + SEEN_EVERY_S
                if self.done.wait(CHECK_EVERY_S):
                    return
        finally:
            self._leave()

    def _check(self, tick: float, *, seen: bool) -> bool:
        """One round; whether it went through. Whatever it raises, the checks go on: a thread that ended here
        would leave the part unwatched, then fenced as cut off from a database that answers."""
        try:
            latest = rental.stop_reason(allocation_id=self.part.allocation.id, now=clock.now())
            self.reached, self.latest = tick, latest
            self.reason = self.reason or latest
            if not latest:
                _keep_up(self.part, self.capture, seen=seen, until=tick + CHECK_EVERY_S)
            elif seen and latest != "released":
                # Stopping (a checkpoint's grace lasts up to an hour), the process still holds its GPUs: silent,
                # it would be released as lost under a job still saving its checkpoint. Once its allocation is
                # released or its attempt replaced, it must not speak for the job any more.
                rental.note_worker_alive(
                    job_id=self.part.job.id, attempt=self.part.allocation.attempt, now=clock.now()
                )
            return True
        except (DatabaseError, InterfaceError):
            _forget_broken_connection()
        except Exception:
            log.exception("a check of allocation %s failed; checking again", self.part.allocation.id)
        return False

    def fenced(self) -> bool:
        return time.monotonic() - self.reached > fence_after_s()

    def hurried(self) -> bool:
        """Whether a checkpoint's grace must end now: cancelled, released or out of its hours meanwhile, or cut
        off (fenced)."""
        return self.latest in (EndReason.CANCELLED, "released", EndReason.TIMED_OUT) or self.fenced()

    def finish(self) -> None:
        """Stops the checks. One under way ends first, unless it outlives the wait: then it keeps the shared
        connection (closed when it ends) and the part's thread goes on with a connection of its own."""
        self.done.set()
        self.join(timeout=2 * CHECK_EVERY_S)
        with self.handover:
            self.orphaned = not self.exited
        if self.orphaned:
            connections[DEFAULT_DB_ALIAS] = connections.create_connection(DEFAULT_DB_ALIAS)
        else:
            self.connection.dec_thread_sharing()

    def _leave(self) -> None:
        with self.handover:
            self.exited = True
            if not self.orphaned:
                return
        try:
            self.connection.close()  # a transaction the late check left open goes with it
        except Exception:
            log.warning("closing a late check's connection failed", exc_info=True)
        finally:
            self.connection.dec_thread_sharing()


class QuietBeats:
    """The part's sign of life, every SEEN_EVERY_S on a thread (and a connection) of its own, while its agent
    works on it with no watcher to say so: from its start until its process runs, and from its process's exit
    (``start``, called as the watcher finishes) until the exit is recorded (``stop``). Those steps write nothing
    else, and a part must not be released as lost because they took over E31_RECONCILE_AFTER_S. Nothing is said
    once the part's allocation is released or its attempt replaced, nor after ``limit_s`` (``doing`` names the
    steps in the log then)."""

    def __init__(self, part: Part, doing: str, *, limit_s: float) -> None:
        self.part = part
        self.doing = doing
        self.limit_s = limit_s
        self.done = threading.Event()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def start(self) -> None:
        with self.lock:
            if self.thread is not None or self.done.is_set():
                return
            self.thread = threading.Thread(target=self._beat, name="part-quiet-beats", daemon=True)
            self.thread.start()

    def stop(self) -> None:
        """Idempotent; a beat under way (a slow database) is not waited for long: it changes nothing once the
        watcher speaks for the part, or once its exit is recorded, the part's job having moved on."""
        with self.lock:
            self.done.set()
            thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2 * CHECK_EVERY_S)

    def _beat(self) -> None:
        until = time.monotonic() + self.limit_s
        try:
            while not self.done.wait(SEEN_EVERY_S) and time.monotonic() < until:
                try:
                    self._once()
                except (DatabaseError, InterfaceError):
                    _forget_broken_connection()
                except Exception:
                    log.exception(
                        "allocation %s: a sign of life while %s failed", self.part.allocation.id, self.doing
                    )
            if not self.done.is_set():
                log.error(
                    "allocation %s: still %s after %.0f s; no longer reported alive",
                    self.part.allocation.id, self.doing, self.limit_s,
                )  # fmt: skip
        finally:
            connections.close_all()  # this thread's own

    def _once(self) -> None:
        if rental.stop_reason(allocation_id=self.part.allocation.id, now=clock.now()) != "released":
            rental.note_worker_alive(
                job_id=self.part.job.id, attempt=self.part.allocation.attempt, now=clock.now()
            )


def fence_after_s() -> float:
    """How long a part runs on with its node cut off from the database. The platform declares the node lost
    ``E31_NODE_TIMEOUT_S`` after its last heartbeat, which may precede the last check by a beat; a check that
    went through is up to a check period old, and stopping the part takes up to ``E31_KILL_GRACE_S``: the part
    is gone before its GPUs can be given to anyone. Never under five check periods, so a check slowed by a busy
    database is not taken for a cut (timeouts compressed below that, as in tests, keep the floor)."""
    spare = settings.E31_HEARTBEAT_S + CHECK_EVERY_S + settings.E31_KILL_GRACE_S
    return max(settings.E31_NODE_TIMEOUT_S - spare, 5 * CHECK_EVERY_S)


def _keep_up(part: Part, capture: LogCapture, *, seen: bool, until: float) -> None:
    """The part's tail, its log in pieces until ``until`` (a slow link never keeps its stop checks waiting long),
    and, when ``seen``, its sign of life."""
    _store_tail(part, capture.text())
    while capture.ship(lambda offset, data: _ship_log(part, offset, data), limit=SHIP_PIECE_BYTES):
        if time.monotonic() >= until:
            break
    if seen:
        rental.note_worker_alive(job_id=part.job.id, attempt=part.allocation.attempt, now=clock.now())


def _forget_broken_connection() -> None:
    try:
        close_old_connections()
    except Exception:  # closing a broken connection can fail in turn; the next check opens a new one
        log.debug("closing a broken connection failed", exc_info=True)


def _with_database(call, *, attempts: int = 30, wait_s: float = 1.0):
    """Runs a service call, waiting out a database restart (up to ~30 s) instead of losing the attempt."""
    for attempt in range(attempts):
        try:
            return call()
        except (OperationalError, InterfaceError):
            if attempt == attempts - 1:
                raise
            close_old_connections()
            time.sleep(wait_s)
    return None


def _paused(part: Part) -> str:
    if not part.job.checkpoints:
        return "yielded its GPUs to a reserved job"
    held = Job.objects.values_list("checkpoint_held_bytes", flat=True).get(id=part.job.id) or 0
    return f"yielded its GPUs to a reserved job; paused with a checkpoint of {format_size(held)}"


def _after_exit(
    part: Part,
    dirs: sandbox.AttemptDirs,
    outcome: str,
    exit_code: int | None,
    *,
    recorded: Callable[[], None] = lambda: None,
) -> None:
    """Records how the part's process ended; ``recorded`` is called once it is, before the seal (which says it is
    alive as it goes)."""
    now = clock.now()
    if outcome == "released":
        return  # the node was declared down or the attempt replaced: RELEASE already happened
    # This part's process has stopped: its GPUs are released; its job moves on once its other parts stopped too.
    if outcome == EndReason.CANCELLED:
        rental.release_part(allocation_id=part.allocation.id, end_reason=EndReason.CANCELLED, now=now,
                            actor=_actor(part), exit_code=exit_code, detail="cancelled while running")  # fmt: skip
        return
    if outcome == PREEMPTED:
        rental.release_part(allocation_id=part.allocation.id, end_reason=PREEMPTED, now=now, actor=_actor(part),
                            detail=_paused(part))  # fmt: skip
        return
    # The platform was out of reach, not the job at fault: back to the queue while it may.
    if outcome == FENCED:
        detail = f"its node could not reach the platform for {fence_after_s():.0f} s; stopped so it never runs twice"
        rental.release_part(allocation_id=part.allocation.id, end_reason=EndReason.NODE_LOST, now=now,
                            actor=_actor(part), exit_code=exit_code, detail=detail)  # fmt: skip
        return
    if outcome == "sibling_failed":
        outcome = STOPPED  # not this part's failure: the attempt's exit code is the failing part's
    if not rental.finish_allocation(
        allocation_id=part.allocation.id, exit_code=exit_code, outcome=outcome, now=now
    ):
        return  # the attempt ended early: nothing of it is sealed
    recorded()
    # Hashing a large output takes minutes: the agent says it is alive meanwhile, as while the job ran, or
    # the reconciler would take it for silent and end a run that succeeded as lost.
    alive = _every(
        SEEN_EVERY_S,
        lambda: rental.note_worker_alive(
            job_id=part.job.id, attempt=part.allocation.attempt, now=clock.now()
        ),
    )
    sealed = seal(
        dirs.output, prefix=f"rank{part.rank}/" if part.num_nodes > 1 else "",
        declared_bytes=part.job.output_bytes, max_files=settings.E31_MAX_OUTPUT_FILES, alive=alive,
    )  # fmt: skip
    rental.seal_allocation(
        allocation_id=part.allocation.id, manifest=sealed.files, refused=sealed.refused, now=clock.now(),
        note=skipped_note(sealed.skipped),
    )  # fmt: skip


@dataclass(frozen=True)
class Sealed:
    files: list[dict]
    refused: str = ""  # why nothing is sealed: the output broke its declaration
    skipped: tuple[str, ...] = ()  # what was left out, not being a regular file (links, pipes), by path


SKIPPED_NAMED = 5


def skipped_note(skipped: tuple[str, ...]) -> str:
    """What the job's page says of the entries a seal left out ('' for none); names quoted, so inert."""
    if not skipped:
        return ""
    named = ", ".join(repr(path[:100]) for path in skipped[:SKIPPED_NAMED])
    more = f" and {len(skipped) - SKIPPED_NAMED} more" if len(skipped) > SKIPPED_NAMED else ""
    return f"not sealed, as not regular files (links, pipes, devices): {named}{more}"


def _every(seconds: float, call: Callable[[], None]) -> Callable[[], None]:
    """``call``, at most once every ``seconds`` however often it is asked for (a beat from inside a long loop)."""
    due = time.monotonic() + seconds

    def beat() -> None:
        nonlocal due
        if time.monotonic() >= due:
            due = time.monotonic() + seconds
            call()

    return beat


def seal(
    output_dir: Path,
    *,
    prefix: str = "",
    declared_bytes: int,
    max_files: int,
    alive: Callable[[], None] = lambda: None,
) -> Sealed:
    """The manifest of what the job wrote (path, bytes, sha256), held to its declaration; ``alive`` is called
    as it goes (throttled by the caller).

    Past ``max_files`` files, or more bytes than declared, nothing is hashed: the count and sizes
    are read first, so 20,000 files or 5 GB declared as 100 bytes cost a directory walk, not a seal.
    """
    found, total, skipped = [], 0, []
    try:
        for path in _regular_files(output_dir, skipped):
            found.append(path)
            if len(found) > max_files:
                return Sealed(
                    [],
                    f"wrote more than {max_files:,} files, the most an attempt may seal (E31_MAX_OUTPUT_FILES)",
                )
            total += path.stat().st_size
    except RecursionError:  # os.walk recurses once per level
        return Sealed([], "nests its folders too deep to be sealed (about a thousand levels)")
    except OSError as exc:  # a file left out would be a file undelivered, uncounted against output.bytes
        return Sealed([], f"a folder under its outputs could not be read ({exc.strerror})")
    if total > declared_bytes:
        return Sealed([], f"wrote {total:,} bytes, declared {declared_bytes:,} (output.bytes)")
    too_long = next((p for p in found if len(prefix + p.relative_to(output_dir).as_posix()) > MAX_PATH), None)
    if too_long is not None:
        # Quoted: the name is the job's own, and the refusal reaches the page, the CLI and e-mail.
        return Sealed([], f"a file's path is longer than {MAX_PATH} characters: {too_long.name[:60]!r}…")
    # A name of bytes that are no UTF-8 text cannot be stored, delivered to an object store or shown.
    unnamed = next((p for p in found if not _is_text(p.relative_to(output_dir).as_posix())), None)
    if unnamed is not None:
        return Sealed([], f"a file's name is not UTF-8 text: {os.fsencode(unnamed.name)[:60]!r}")
    left_out = tuple(sorted(prefix + p.relative_to(output_dir).as_posix() for p in skipped))
    return Sealed([_entry(output_dir, path, prefix, alive) for path in sorted(found)], skipped=left_out)


def _is_text(name: str) -> bool:
    """Whether a name read from the disk is UTF-8 text (bytes that are not come back as lone surrogates)."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def _regular_files(root: Path, skipped: list[Path]):
    """Regular files under ``root``, never following links (a link to a host file is not an output); anything
    else but a folder (a link, to a folder too, a pipe, a device) goes to ``skipped``. A folder that cannot be
    listed raises (OSError): os.walk would leave it out silently, past PATH_MAX say."""
    for folder, folders, names in os.walk(root, onerror=trees.raise_it):
        skipped.extend(Path(folder) / name for name in folders if (Path(folder) / name).is_symlink())
        for name in names:
            path = Path(folder) / name
            if stat.S_ISREG(path.lstat().st_mode):
                yield path
            else:
                skipped.append(path)


def _entry(output_dir: Path, path: Path, prefix: str, alive: Callable[[], None]) -> dict:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
            alive()
    rel = prefix + path.relative_to(output_dir).as_posix()
    return {"path": rel, "bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def _image(part: Part) -> sandbox.ImageView | None:
    """The job's image as staged for it (by the digest it resolved to); None for the node's own view."""
    if not part.job.image:
        return None
    pull = ImagePull.objects.select_related("entry").filter(job_id=part.job.id).first()
    if pull is None or pull.entry is None or not image_staging.rootfs(pull.entry.key).is_dir():
        raise RuntimeError(f"the job's image {part.job.image} is not staged on this pool's storage")
    return sandbox.ImageView.from_config(image_staging.rootfs(pull.entry.key), pull.entry.config)


def _job_env(
    part: Part, dirs: sandbox.AttemptDirs, image: sandbox.ImageView | None, driver_libraries: tuple = ()
) -> dict[str, str]:
    """Only what the job declared plus what the platform owes it; none of the agent's own settings.

    ``dirs`` as the job sees them. An image's Env comes first (its PATH too); the job's env overrides it.
    """
    if image is None:  # NVIDIA's folder, outside the loader's cache
        driver = [str(d) for d in devices.DRIVER_DIRS if d.is_dir()]
    else:
        driver = sandbox.image_library_path(driver_libraries)
    image_env = image.environment() if image else {}
    declared = {**image_env, **part.job.env}
    libraries = {"LD_LIBRARY_PATH": ":".join(filter(None, [declared.get("LD_LIBRARY_PATH"), *driver]))}
    return {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(dirs.work),
        "TMPDIR": "/tmp",
        **declared,
        "CUDA_VISIBLE_DEVICES": part.visible_devices,
        "E31_JOB_ID": str(part.job.id),
        "E31_ATTEMPT": str(part.allocation.attempt),
        "E31_DATA_DIR": str(dirs.data),
        "E31_OUTPUT_DIR": str(dirs.output),
        "E31_NUM_GPUS": str(part.num_gpus),
        **_rank_env(part),
        **_array_env(part.job),
        **_checkpoint_env(part, dirs),
        **(libraries if driver else {}),
    }


def _checkpoint_env(part: Part, inside: sandbox.AttemptDirs) -> dict[str, str]:
    """Where to checkpoint, and whether this attempt was handed a checkpoint to resume from."""
    if inside.checkpoint is None:
        return {}
    handed = part.allocation.attempt > 1 and any(checkpoints.directory(part.job.id).iterdir())
    return {"E31_CHECKPOINT_DIR": str(inside.checkpoint), "E31_RESUMED": "1" if handed else "0"}


def _rank_env(part: Part) -> dict[str, str]:
    """A part of a job spanning nodes learns its rank and where rank 0 listens; a one-node job sees none of them."""
    if part.num_nodes == 1:
        return {}
    return {
        "E31_NODE_RANK": str(part.rank),
        "E31_NUM_NODES": str(part.num_nodes),
        "E31_COORDINATOR": part.coordinator,
    }


def _array_env(job) -> dict[str, str]:
    """A task of an array learns which one it is; other jobs see neither variable."""
    if job.array_id is None:
        return {}
    return {"E31_ARRAY_ID": str(job.array_id), "E31_ARRAY_INDEX": str(job.array_index)}


def remove_expired_attempts(*, node_name: str, now) -> list[str]:
    """Removes attempt directories E31_ATTEMPT_RETENTION_S after RELEASE and delivery: nothing a job wrote lingers."""
    jobs_dir = sandbox.agent_root(node_name) / "jobs"
    if not jobs_dir.is_dir():
        return []
    cutoff = now - timedelta(seconds=settings.E31_ATTEMPT_RETENTION_S)
    removed = []
    for entry in jobs_dir.iterdir():
        job_id, _, attempt = entry.name.partition("-")
        if not (job_id.isdigit() and attempt.isdigit()):
            continue
        allocation = (
            Allocation.objects.filter(job_id=int(job_id), attempt=int(attempt), node__name=node_name)
            .select_related("job")
            .first()
        )
        if allocation is None or _finished_before(allocation, cutoff):
            try:
                attempt_space.release(entry)  # its bounded filesystem first: the files go with its image
                left = trees.remove_tree(entry)
            except (OSError, subprocess.SubprocessError):  # one attempt's trouble never keeps the others
                log.exception("could not remove attempt directory %s", entry)
                continue
            if not left:  # else the next sweep tries again
                removed.append(entry.name)
    return removed


def remove_ended_checkpoints(*, job_ids: list[int] | None = None) -> list[int]:
    """Removes the checkpoint directories of jobs that have ended, however they ended (or are gone): their ids."""
    stored = checkpoints.stored_job_ids() if job_ids is None else job_ids
    alive = set(
        Job.objects.filter(id__in=stored)
        .exclude(state__in=(State.RELEASED, State.ENDED))
        .values_list("id", flat=True)
    )
    removed = []
    for job_id in (job_id for job_id in stored if job_id not in alive):
        try:
            if checkpoints.remove(job_id):  # else rm left some of it: the next sweep tries again
                removed.append(job_id)
        except Exception:  # one that cannot go now must not keep the others: the next sweep tries again
            log.exception("job %s: its checkpoint could not be removed", job_id)
    return removed


def _finished_before(allocation: Allocation, cutoff) -> bool:
    if allocation.released_at is None or allocation.job.delivery_state == "delivering":
        return False
    done = max(filter(None, (allocation.released_at, allocation.delivered_at, allocation.job.delivered_at)))
    return done < cutoff


def _store_tail(part: Part, text: str) -> None:
    if part.rank == 0:  # the first part's output is the job page's tail
        rental.store_log_tail(job_id=part.job.id, attempt=part.allocation.attempt, text=text)


def _ship_log(part: Part, offset: int, data: bytes) -> None:
    logs.append_log(
        job_id=part.job.id, attempt=part.allocation.attempt, rank=part.rank, offset=offset, data=data
    )


def _actor(part: Part) -> str:
    return rental.agent_actor(part.allocation.node.name)
