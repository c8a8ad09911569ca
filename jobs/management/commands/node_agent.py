"""Starts the agent of one GPU node: registers it, heartbeats, and serves queue node.<name>."""

import argparse
import logging
import math
import os
import signal
import socket
import threading
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import celery
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections, connection

from common import schema
from jobs import (
    agent,
    clock,
    gpu_usage,
    gpus,
    leftovers,
    limits,
    network,
    nodes,
    sandbox,
    selectors,
    tasks,
    units,
)

# How often a running agent looks at the database's migrations: one query of an ~80-row table (0.4 ms measured
# on the test database, the comparison 0.05 ms more), so a thousand nodes add some 17 small queries a second.
SCHEMA_LOOK_S = 60
UNSENT_MINUTES = 10_000  # GPU-minute summaries kept for a database that is away (hours of a full node)
MACHINE_IDS = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))
log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Runs a node agent: python manage.py node_agent --name gpu-07 [--gpus 8 | --virtual-gpus 4]"

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True, help="the node's name, unique in the pool")
        parser.add_argument(
            "--gpus", type=int, default=None, dest="gpu_cap",
            help="use at most this many of the GPUs found (NVML, else nvidia-smi); default: all of them",
        )  # fmt: skip
        parser.add_argument(
            "--virtual-gpus", type=int, default=None,
            help="serve this many made-up GPUs instead of looking for real ones (a node without GPUs, tests)",
        )  # fmt: skip
        parser.add_argument("--gpu-model", default="", help="the model virtual GPUs claim; default 'virtual'")
        parser.add_argument(
            "--address", default="", help="address other nodes reach this one on (multi-node jobs)"
        )
        parser.add_argument(
            "--memory", type=_size, default=None,
            help="memory offered to jobs, at most what the machine has less its reserve (for example '64 GB'); default: all of that",
        )  # fmt: skip
        parser.add_argument(
            "--cpus",
            type=_cpus,
            default=None,
            help="CPUs offered to jobs, at most the machine's; default: all",
        )
        parser.add_argument(
            "--uid-base", type=int, default=settings.E31_JOB_UID_BASE,
            help="first host uid this agent runs jobs under (one per running attempt; E31_JOB_UID_BASE)",
        )  # fmt: skip
        parser.add_argument(
            "--uid-count", type=int, default=settings.E31_JOB_UID_COUNT,
            help="how many uids from --uid-base belong to this agent (E31_JOB_UID_COUNT)",
        )  # fmt: skip
        parser.add_argument(
            "--allow-unsandboxed", action="store_true", default=settings.E31_ALLOW_UNSANDBOXED,
            help="run jobs without bubblewrap (labelled on the pool page); refused otherwise",
        )  # fmt: skip

    def handle(
        self, *args, name: str, gpu_cap: int | None, virtual_gpus: int | None, gpu_model: str, address: str,
        allow_unsandboxed: bool, memory: int | None, cpus: float | None, uid_base: int, uid_count: int, **options,
    ):  # fmt: skip
        if not name.replace("-", "").replace("_", "").isalnum():
            raise CommandError("--name is letters, digits, - and _")
        # First of all, before it sweeps, claims or registers anything: old code must not act on a new schema.
        if reason := schema.check(connection):
            raise CommandError(f"node {name} not started: {reason}")
        seen = schema.applied(connection)
        found, source = _find_gpus(cap=gpu_cap, virtual_gpus=virtual_gpus, gpu_model=gpu_model)
        try:
            tasks.AGENT["uids"] = sandbox.UidRange(uid_base, uid_count)
            if os.geteuid() == 0:  # only a root agent hands out uids
                sandbox.claim_uids(tasks.AGENT["uids"], settings.E31_UID_REGISTRY)
        except (ValueError, sandbox.UidRangeTaken) as exc:
            raise CommandError(str(exc)) from exc
        _check_the_view(name)
        why_not = sandbox.refusal(probe_uid=uid_base)
        if why_not and not allow_unsandboxed:
            raise CommandError(
                f"jobs cannot be sandboxed here: {why_not}. Fix that, or start with --allow-unsandboxed "
                "(E31_ALLOW_UNSANDBOXED=1) to run them unsandboxed, labelled so on the pool page."
            )
        if why_not:
            self.stdout.write(f"node {name}: jobs run UNSANDBOXED, as allowed: {why_not}")
        mode = sandbox.UNSANDBOXED if why_not else sandbox.BUBBLEWRAP
        tasks.AGENT["mode"], tasks.AGENT["node"] = mode, name
        if removed := leftovers.sweep(node_name=name, uids=tasks.AGENT["uids"]):
            self.stdout.write(f"node {name}: removed what an earlier agent left: {', '.join(removed)}")
        if mode == sandbox.BUBBLEWRAP:
            raised = [sandbox.raise_file_max(attempts=len(found)), sandbox.raise_pid_max(attempts=len(found)),
                      *sandbox.raise_socket_memory()]  # fmt: skip
            for said in filter(None, raised):
                self.stdout.write(f"node {name}: {said}")
        tasks.AGENT["gpu_uuids"] = _uuids(found)
        refusal = network.refusal() if mode == sandbox.BUBBLEWRAP else "it runs jobs unsandboxed"
        bounds = _limits(name)
        register = {"name": name, "address": address or socket.getfqdn(), "host_id": host_identity(),
                    **_gpu_fields(found, source),
                    "agent_version": schema.code().version, "sandbox": mode, "memory_bytes": limits.node_memory(memory),
                    "cpus": limits.node_cpus(cpus), "limits": bounds, "multi_node_refusal": refusal,
                    "disk_bytes": limits.disk_size(sandbox.agent_root(name) / "jobs", bounds)}  # fmt: skip
        clock.synchronise()  # what it reports is dated by the database's time, not this node's clock
        try:
            _register(register)
        except nodes.NodeNameTaken as exc:
            raise CommandError(str(exc)) from exc
        if limits.DISK_BOUNDED in register["limits"]:
            if shortfall := limits.disk_shortfall(sandbox.agent_root(name) / "jobs", len(found)):
                self.stdout.write(f"node {name}: {shortfall}")
        self.stdout.write(
            f"node {name}: {_describe(found, source)}, {units.format_size(register['memory_bytes'])} and "
            f"{register['cpus']:g} CPUs for jobs, sandbox {mode}, limits: {register['limits']}, queue node.{name}"
        )
        if refusal:
            self.stdout.write(f"node {name} takes one-node jobs only: {refusal}")
        threading.Thread(target=_heartbeat, args=(register,), daemon=True, name="heartbeat").start()
        threading.Thread(target=_sweep, args=(name,), daemon=True, name="attempt-sweep").start()
        threading.Thread(target=_watch_schema, args=(name, seen), daemon=True, name="schema-watch").start()
        if source != gpus.VIRTUAL:  # virtual GPUs never change and have nothing to measure
            # Threads of their own: nvidia-smi can take seconds (or hang to its timeout), and a late
            # heartbeat gets a node declared down; a slow rescan must not thin out the samples either.
            threading.Thread(
                target=_rescan_gpus, args=(register, gpu_cap), daemon=True, name="gpu-scan"
            ).start()
            threading.Thread(target=_sample_gpus, args=(register,), daemon=True, name="gpu-samples").start()
        # The project's Celery app (e31web.celery), made current when Django loaded its settings.
        celery.current_app.worker_main(
            [
                "worker", "--queues", f"node.{name}", "--pool", "threads", "--concurrency", str(len(found) + 2),
                "--hostname", f"agent-{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
                "--loglevel", "INFO",
            ]
        )  # fmt: skip


def _find_gpus(*, cap: int | None, virtual_gpus: int | None, gpu_model: str) -> tuple[list[gpus.Gpu], str]:
    """The GPUs this agent serves: made up with --virtual-gpus, else found (and capped by --gpus)."""
    if virtual_gpus is not None:
        if virtual_gpus < 1 or cap is not None:
            raise CommandError("--virtual-gpus is at least 1, and replaces --gpus")
        return gpus.virtual(virtual_gpus, model=gpu_model or gpus.VIRTUAL), gpus.VIRTUAL
    if cap is not None and cap < 1:
        raise CommandError("--gpus is at least 1")
    found, source = gpus.discover()
    if not found:
        raise CommandError(
            "no GPU found through NVML or nvidia-smi. On a node without GPUs, serve virtual ones: --virtual-gpus N"
        )
    return gpus.capped(found, cap), source


def _gpu_fields(found: list[gpus.Gpu], source: str) -> dict:
    """What register_node records of the GPUs: their count, the model most of them are, each one."""
    models = Counter(gpu.model for gpu in found)
    return {"gpus": len(found), "gpu_model": models.most_common(1)[0][0] if models else "",
            "gpu_list": [asdict(gpu) for gpu in found], "gpu_source": source}  # fmt: skip


def host_identity(candidates: tuple[Path, ...] = MACHINE_IDS, configured: str | None = None) -> str:
    """The machine this agent runs on, as the pool tells one node's machine from another's: E31_NODE_HOST_ID
    where set (an agent in a container, whose host name changes with each container, names the GPU machine),
    else its machine-id (systemd's, else D-Bus's), else its host name."""
    configured = settings.E31_NODE_HOST_ID if configured is None else configured
    if configured.strip():
        return configured.strip()[:64]
    for path in candidates:
        try:
            if machine_id := path.read_text().strip()[:64]:
                return machine_id
        except OSError:
            continue
    return f"host:{socket.gethostname()}"[:64]


def _uuids(found: list[gpus.Gpu]) -> dict[int, str]:
    return {gpu.index: gpu.uuid for gpu in found if gpu.uuid}


def _describe(found: list[gpus.Gpu], source: str) -> str:
    if source == gpus.VIRTUAL:
        return f"{len(found)} virtual GPU(s)"
    first = found[0]
    return (f"{len(found)} GPU(s) from {source} ({', '.join(sorted({gpu.model for gpu in found}))}, "
            f"driver {first.driver_version or '?'}, CUDA {first.cuda_version or '?'})")  # fmt: skip


def _limits(name: str) -> str:
    """The controllers that bound each attempt, and whether its disk is bounded (for the pool page)."""
    described = limits.probe(name)
    disk = limits.probe_space(sandbox.agent_root(name) / "jobs")
    uid = (
        "" if os.geteuid() == 0 else f"; {sandbox.SHARED_UID}"
    )  # before the disk part: its reason can be long
    oom = "" if sandbox.floors_oom_score() else f"; {sandbox.NO_OOM_FLOOR}"
    tail = f"{uid}{oom}; {disk or limits.DISK_BOUNDED}"
    # The pool keeps LIMITS_CHARS of it, and agents find the disk part in what it keeps: the cgroup reason is cut.
    return described[: max(0, nodes.LIMITS_CHARS - len(tail))] + tail


def _size(text: str) -> int:
    try:
        size = units.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if size < 2**26:
        raise argparse.ArgumentTypeError("at least 64 MiB")
    return size


def _cpus(text: str) -> float:
    try:
        cpus = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of CPUs") from exc
    if not math.isfinite(cpus) or cpus <= 0:
        raise argparse.ArgumentTypeError("more than 0 CPUs")
    return cpus


def _check_the_view(name: str) -> None:
    """Refuses to start where a job would see platform state, or could not reach its own directories."""
    platform = [settings.STATE_DIR, settings.E31_AGENT_ROOT, settings.E31_STAGING_ROOT, settings.E31_CHECKPOINT_ROOT,
                *settings.E31_DATA_ROOTS, *settings.E31_OUTPUT_ROOTS, *settings.SECRET_FILES]  # fmt: skip
    if exposed := sandbox.exposed_by_view(platform):
        raise CommandError(
            f"{', '.join(map(str, exposed))} would be visible to jobs: move it out of {sandbox.VIEW['system']} and /etc"
        )
    jobs_dir = sandbox.agent_root(name) / "jobs"
    jobs_dir.mkdir(parents=True, exist_ok=True)
    settings.E31_CHECKPOINT_ROOT.mkdir(parents=True, exist_ok=True)
    for path in (jobs_dir, settings.E31_STAGING_ROOT, settings.E31_CHECKPOINT_ROOT):
        if refused := sandbox.traversal_refusal(path):
            raise CommandError(refused)


def _register(register: dict) -> None:
    """Registers the node at the agent's start; this code matches the schema (it was checked), so a node that an
    agent on older code drained for the upgrade takes work again."""
    nodes.register_node(now=clock.now(), **register)
    nodes.resume_upgraded_node(name=register["name"], now=clock.now())


def _watch_schema(name: str, seen: frozenset, stop: threading.Event | None = None) -> None:
    """Every SCHEMA_LOOK_S, a look at the database's migrations (see _look_at_schema)."""
    stop = stop or threading.Event()
    while not stop.wait(SCHEMA_LOOK_S):
        try:
            close_old_connections()
            seen = _look_at_schema(name, seen)
        except Exception:  # the database is restarting: the next look will get through
            log.warning("node %s: schema not checked", name, exc_info=True)
            close_old_connections()


def _look_at_schema(name: str, seen: frozenset) -> frozenset:
    """The migrations applied now: unchanged since ``seen``, that is all (one query). Changed, and this code no
    longer matches them: the node takes no new work, its running jobs go on to their end, and the pool page says
    why; an agent restarted on the upgraded checkout brings it back. Returns what the next look compares with:
    ``seen`` while they disagree, so each look drains it again if an operator resumed it meanwhile."""
    applied = schema.applied(connection)
    if applied == seen:
        return seen
    reason = schema.disagreement(schema.code(), applied)
    if not reason:
        return applied
    if nodes.drain_for_upgrade(name=name, reason=reason, now=clock.now()):
        log.warning("node %s takes no new work: %s", name, reason)
    return seen


def _heartbeat(register: dict, stop: threading.Event | None = None) -> None:
    """Beats every E31_HEARTBEAT_S; a node declared down meanwhile registers again (its old attempts are lost).

    Nothing else runs on this thread: a beat late past E31_NODE_TIMEOUT_S gets the node declared lost and its
    running jobs with it, so slow work (removing a large attempt, a checkpoint) has a thread of its own.
    """
    stop = stop or threading.Event()
    while not stop.wait(settings.E31_HEARTBEAT_S):
        try:
            close_old_connections()
            disk_free = limits.disk_free(
                sandbox.agent_root(register["name"]) / "jobs", register.get("limits", "")
            )
            if not nodes.heartbeat(
                name=register["name"], now=clock.now(), disk_free=disk_free, host_id=register["host_id"]
            ):
                nodes.register_node(now=clock.now(), **register)
            clock.synchronise()  # a node's clock drifts: the database's time is read again after every beat
        except nodes.NodeNameTaken as exc:
            # Declared down while cut off, and another machine serves the name now: this agent must not serve
            # the node's queue beside it. Its running jobs were lost with the node; the worker stops warm.
            log.error("node %s: this agent stops: %s", register["name"], exc)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        except Exception:  # the database is restarting: keep beating, the next one will get through
            close_old_connections()


def _sweep(name: str, stop: threading.Event | None = None) -> None:
    """Removes attempt directories past E31_ATTEMPT_RETENTION_S after their delivery, and ended jobs' checkpoints."""
    stop = stop or threading.Event()
    every = min(60.0, max(settings.E31_HEARTBEAT_S, settings.E31_ATTEMPT_RETENTION_S / 2))
    while not stop.wait(every):
        try:
            close_old_connections()
            agent.remove_expired_attempts(node_name=name, now=clock.now())
            agent.remove_ended_checkpoints()
        except Exception:  # the database is restarting, or one removal failed: the next pass tries again
            log.exception("node %s: the sweep of old attempts failed; it runs again in %.0f s", name, every)
            close_old_connections()


def _rescan(register: dict, cap: int | None) -> None:
    """Registers the GPU set again when it changed: the scheduler stops placing on a GPU that is gone.

    A scan that finds nothing at all (the driver restarting, nvidia-smi hung) changes nothing.
    """
    found, source = gpus.discover()
    found = gpus.capped(found, cap)
    if not found or _identity(found) == _identity(register["gpu_list"]):
        return
    nodes.update_node_gpus(name=register["name"], gpu_list=[asdict(gpu) for gpu in found], now=clock.now())
    register.update(_gpu_fields(found, source))
    tasks.AGENT["gpu_uuids"] = _uuids(found)


def _rescan_gpus(register: dict, cap: int | None) -> None:
    """Every E31_GPU_RESCAN_S, the GPU set found again (a GPU fallen off the bus is registered missing)."""
    stop = threading.Event()
    while not stop.wait(settings.E31_GPU_RESCAN_S):
        try:
            close_old_connections()
            _rescan(register, cap)
        except Exception:  # the database is restarting: the next scan will get through
            log.warning("node %s: GPU set not checked", register["name"], exc_info=True)
            close_old_connections()


def _sample_gpus(register: dict) -> None:
    """Every E31_GPU_SAMPLE_S: each GPU's reading for the pool page, folded per minute for the jobs holding it.

    A minute the database did not take is offered again at the next sample (the last UNSENT_MINUTES of them).
    """
    stop, minutes, unsent = threading.Event(), gpus.Minutes(), []
    while not stop.wait(settings.E31_GPU_SAMPLE_S):
        try:
            close_old_connections()
            unsent = (unsent + _sample_once(register, minutes))[-UNSENT_MINUTES:]
            gpu_usage.record_gpu_minutes(node_name=register["name"], minutes=unsent)
            unsent = []
        except Exception:  # the database is restarting: the next sample will get through
            log.warning("node %s: GPU sample not recorded", register["name"], exc_info=True)
            close_old_connections()


def _sample_once(register: dict, minutes: gpus.Minutes) -> list[dict]:
    """Samples the node's GPUs now; the minute summaries that closed."""
    samples = gpus.sample([gpus.Gpu(**g) for g in register["gpu_list"]], register["gpu_source"])
    now = clock.now()  # after the reading: nvidia-smi may take seconds
    gpu_usage.record_gpu_readings(node_name=register["name"], readings=[asdict(s) for s in samples], now=now)
    running = selectors.running_allocations(node_name=register["name"])
    by_index = {s.index: s for s in samples}
    for allocation_id, indices in running.items():
        for index in indices:
            if index in by_index:
                minutes.add(allocation_id=allocation_id, sample=by_index[index], at=now)
    return minutes.closed(now=now, running=running)


def _identity(gpu_list) -> set[tuple[int, str]]:
    return {(g["index"], g["uuid"]) if isinstance(g, dict) else (g.index, g.uuid) for g in gpu_list}
