"""Starts the agent of one GPU node: registers it, heartbeats, and serves queue node.<name>."""

import socket
import threading

import celery
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections
from django.utils import timezone

from jobs import nodes, sandbox, tasks

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
            "--allow-unsandboxed", action="store_true", default=settings.E31_ALLOW_UNSANDBOXED,
            help="run jobs without bubblewrap (labelled on the pool page); refused otherwise",
        )  # fmt: skip

    def handle(
        self, *args, name: str, gpus: int, gpu_model: str, address: str, allow_unsandboxed: bool, **options
    ):
        if gpus < 1 or not name.replace("-", "").replace("_", "").isalnum():
            raise CommandError("--name is letters, digits, - and _; --gpus at least 1")
        mode = sandbox.available_mode() or (sandbox.UNSANDBOXED if allow_unsandboxed else "")
        if not mode:
            raise CommandError(
                "bubblewrap (bwrap) is not usable here, so jobs cannot be sandboxed. Install it "
                "(apt-get install bubblewrap) or start with --allow-unsandboxed (E31_ALLOW_UNSANDBOXED=1)."
            )
        tasks.AGENT["mode"] = mode
        nodes.register_node(
            name=name, gpus=gpus, gpu_model=gpu_model or "virtual", address=address or socket.getfqdn(),
            agent_version=AGENT_VERSION, sandbox=mode, now=timezone.now(),
        )  # fmt: skip
        self.stdout.write(f"node {name}: {gpus} GPU(s), sandbox {mode}, queue node.{name}")
        register = {"name": name, "gpus": gpus, "gpu_model": gpu_model or "virtual", "address": address or socket.getfqdn(),
                    "agent_version": AGENT_VERSION, "sandbox": mode}  # fmt: skip
        threading.Thread(target=_heartbeat, args=(register,), daemon=True, name="heartbeat").start()
        # The project's Celery app (e31web.celery), made current when Django loaded its settings.
        celery.current_app.worker_main(
            [
                "worker", "--queues", f"node.{name}", "--pool", "threads", "--concurrency", str(gpus + 2),
                "--hostname", f"agent-{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
                "--loglevel", "INFO",
            ]
        )  # fmt: skip


def _heartbeat(register: dict) -> None:
    """Beats every E31_HEARTBEAT_S; a node declared down meanwhile registers again (its old attempts are lost)."""
    stop = threading.Event()
    while not stop.wait(settings.E31_HEARTBEAT_S):
        try:
            close_old_connections()
            if not nodes.heartbeat(name=register["name"], now=timezone.now()):
                nodes.register_node(now=timezone.now(), **register)
        except Exception:  # the database is restarting: keep beating, the next one will get through
            close_old_connections()
