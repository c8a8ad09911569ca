"""Starts the agent of one GPU node: registers it, heartbeats, and serves queue node.<name>."""

import argparse
import math
import os
import socket
import threading
import time

import celery
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections
from django.utils import timezone

from jobs import agent, devices, limits, network, nodes, sandbox, tasks, units

AGENT_VERSION = "1.0"


class Command(BaseCommand):
    help = "Runs a node agent: python manage.py node_agent --name gpu-07 --gpus 8 [--gpu-model H100]"

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True, help="the node's name, unique in the pool")
        parser.add_argument(
            "--gpus", type=int, required=True, help="GPUs on this node (virtual indices without a GPU)"
        )
        parser.add_argument(
            "--gpu-model", default="", help="for example H100; 'virtual' when none is present"
        )
        parser.add_argument(
            "--address", default="", help="address other nodes reach this one on (multi-node jobs)"
        )
        parser.add_argument(
            "--memory", type=_size, default=None,
            help="memory offered to jobs, at most what the machine has (for example '64 GB'); default: all of it",
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
        self, *args, name: str, gpus: int, gpu_model: str, address: str, allow_unsandboxed: bool,
        memory: int | None, cpus: float | None, uid_base: int, uid_count: int, **options,
    ):  # fmt: skip
        if gpus < 1 or not name.replace("-", "").replace("_", "").isalnum():
            raise CommandError("--name is letters, digits, - and _; --gpus at least 1")
        try:
            tasks.AGENT["uids"] = sandbox.UidRange(uid_base, uid_count)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        _check_the_view(name)
        mode = sandbox.available_mode(probe_uid=uid_base) or (
            sandbox.UNSANDBOXED if allow_unsandboxed else ""
        )
        if not mode:
            raise CommandError(
                "bubblewrap (bwrap) is not usable here, so jobs cannot be sandboxed. Install it "
                "(apt-get install bubblewrap) or start with --allow-unsandboxed (E31_ALLOW_UNSANDBOXED=1)."
            )
        tasks.AGENT["mode"] = mode
        tasks.AGENT["gpu_uuids"] = devices.gpu_uuids()
        refusal = network.refusal() if mode == sandbox.BUBBLEWRAP else "it runs jobs unsandboxed"
        register = {"name": name, "gpus": gpus, "gpu_model": gpu_model or "virtual", "address": address or socket.getfqdn(),
                    "agent_version": AGENT_VERSION, "sandbox": mode, "memory_bytes": limits.node_memory(memory),
                    "cpus": limits.node_cpus(cpus), "limits": _limits(name), "multi_node_refusal": refusal}  # fmt: skip
        nodes.register_node(now=timezone.now(), **register)
        self.stdout.write(
            f"node {name}: {gpus} GPU(s), {units.format_size(register['memory_bytes'])} and {register['cpus']:g} CPUs "
            f"for jobs, sandbox {mode}, limits: {register['limits']}, queue node.{name}"
        )
        if refusal:
            self.stdout.write(f"node {name} takes one-node jobs only: {refusal}")
        threading.Thread(target=_heartbeat, args=(register,), daemon=True, name="heartbeat").start()
        # The project's Celery app (e31web.celery), made current when Django loaded its settings.
        celery.current_app.worker_main(
            [
                "worker", "--queues", f"node.{name}", "--pool", "threads", "--concurrency", str(gpus + 2),
                "--hostname", f"agent-{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
                "--loglevel", "INFO",
            ]
        )  # fmt: skip


def _limits(name: str) -> str:
    """The controllers that bound each attempt, and whether its disk is bounded (for the pool page)."""
    described = limits.probe(name)
    disk = limits.probe_space(sandbox.agent_root(name) / "jobs")
    uid = (
        "" if os.geteuid() == 0 else f"; {sandbox.SHARED_UID}"
    )  # before the disk part: its reason can be long
    return f"{described}{uid}; {disk or limits.DISK_BOUNDED}"


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
    platform = [settings.STATE_DIR, settings.E31_AGENT_ROOT, settings.E31_STAGING_ROOT,
                *settings.E31_DATA_ROOTS, *settings.E31_OUTPUT_ROOTS, *settings.SECRET_FILES]  # fmt: skip
    if exposed := sandbox.exposed_by_view(platform):
        raise CommandError(
            f"{', '.join(map(str, exposed))} would be visible to jobs: move it out of {sandbox.VIEW['system']} and /etc"
        )
    jobs_dir = sandbox.agent_root(name) / "jobs"
    jobs_dir.mkdir(parents=True, exist_ok=True)
    for path in (jobs_dir, settings.E31_STAGING_ROOT):
        if blocked := sandbox.untraversable(path):
            raise CommandError(
                f"job uids cannot pass through {blocked} to reach {path}: allow it (chmod o+x {blocked}); "
                "they still cannot list it, and inside the sandbox only their own directories exist"
            )


def _heartbeat(register: dict) -> None:
    """Beats every E31_HEARTBEAT_S; a node declared down meanwhile registers again (its old attempts are lost).

    The same thread removes attempt directories past E31_ATTEMPT_RETENTION_S after their delivery.
    """
    stop = threading.Event()
    sweep_every = min(60.0, max(settings.E31_HEARTBEAT_S, settings.E31_ATTEMPT_RETENTION_S / 2))
    next_sweep = time.monotonic()
    while not stop.wait(settings.E31_HEARTBEAT_S):
        try:
            close_old_connections()
            if not nodes.heartbeat(name=register["name"], now=timezone.now()):
                nodes.register_node(now=timezone.now(), **register)
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + sweep_every
                agent.remove_expired_attempts(node_name=register["name"], now=timezone.now())
        except Exception:  # the database is restarting: keep beating, the next one will get through
            close_old_connections()
