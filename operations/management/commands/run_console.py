"""`make run`: migrates, creates the demo accounts, and starts web, the control, staging and notification
workers, beat and a local pool.

The console supervises its children (operations.supervisor): one that exits is restarted after a
growing pause, and only Ctrl-C, TERM or a hangup (the terminal closed) stops them all.
"""

import fcntl
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TextIO

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError
from django.utils import timezone

from jobs import dispatch, sandbox
from operations import services, supervisor

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = (
        "Runs the whole console locally: web, control, staging and notification workers, beat and virtual GPU "
        "nodes; restarts any that exits. Ctrl-C stops all."
    )

    def add_arguments(self, parser):
        parser.add_argument("--nodes", type=int, default=int(os.environ.get("E31_LOCAL_NODES", 2)))
        parser.add_argument("--gpus-per-node", type=int, default=int(os.environ.get("E31_LOCAL_GPUS", 4)))
        parser.add_argument("--port", default=os.environ.get("PORT", "8000"))

    def handle(self, *args, nodes: int, gpus_per_node: int, port: str, **options):
        if refused := sandbox.traversal_refusal(settings.STATE_DIR):
            raise CommandError(refused)  # else every local node would exit at start, and restart, forever
        self._state_lock = _lock_state_dir(settings.STATE_DIR)  # held while this console runs
        # After the lock, so a second console on this folder is told so, not that its port is taken; before any
        # child, or the printed address would reach another program while the web server restarts for ever.
        try:
            _check_port(port)
        except CommandError:
            self._state_lock.close()
            raise
        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write(
            self.style.SUCCESS("Database ready: " + settings.DATABASES["default"]["NAME"].__str__())
        )
        call_command("ensure_demo_accounts")
        example = self._write_example_job()
        # The address e-mailed links name (invitations, password resets, job ends): the port served, unless set.
        env = {"E31_CONSOLE_URL": f"http://127.0.0.1:{port}", **os.environ, "PYTHONUNBUFFERED": "1"}
        agent_flags = []
        if why_not := sandbox.refusal(probe_uid=settings.E31_JOB_UID_BASE):
            self.stdout.write(self.style.WARNING(
                f"{why_not}: the local nodes run jobs UNSANDBOXED (the pool page says so). "
                "apt-get install bubblewrap libseccomp2 to sandbox them."
            ))  # fmt: skip
            agent_flags = ["--allow-unsandboxed"]
        py = [sys.executable, "manage.py"]
        celery = [sys.executable, "-m", "celery", "-A", "e31web"]
        beat_file = str(settings.STATE_DIR / "celerybeat-schedule")
        commands = {
            "web": [sys.executable, "-m", "gunicorn", "e31web.wsgi", "--bind", f"127.0.0.1:{port}",
                    "--workers", "2", "--threads", "4", "--access-logfile", "-"],
            "worker": [*celery, "worker", "--queues", dispatch.control_queue(), "--pool", "threads",
                       "--concurrency", "4", "--hostname", "control@%h", "--loglevel", "INFO"],
            # Copies and pulls apart from the control plane: one thread per transfer slot, one for the tries of jobs
            # waiting for one (they give their thread back between tries) and for cache hits.
            "stager": [*celery, "worker", "--queues", dispatch.staging_queue(), "--pool", "threads",
                       "--concurrency", str(settings.E31_STAGE_CONCURRENCY + 1), "--hostname", "staging@%h",
                       "--loglevel", "INFO"],
            # Webhooks and e-mails apart from the control plane too: a receiver that never answers holds a thread.
            "notifier": [*celery, "worker", "--queues", dispatch.notify_queue(), "--pool", "threads",
                         "--concurrency", "4", "--hostname", "notify@%h", "--loglevel", "INFO"],
            "beat": [*celery, "beat", "--schedule", beat_file, "--loglevel", "INFO"],
        }  # fmt: skip
        for i in range(1, nodes + 1):
            commands[f"local-{i}"] = [
                *py,
                "node_agent",
                "--name",
                f"local-{i}",
                "--virtual-gpus",
                str(gpus_per_node),
                "--uid-base",  # each local node owns its own range of job uids
                str(settings.E31_JOB_UID_BASE + (i - 1) * settings.E31_JOB_UID_COUNT),
                *agent_flags,
            ]
        # The children hold the lock too: were this process killed, they would run on, and so must the lock.
        console = supervisor.Supervisor(
            commands, env=env, report=_report, pass_fds=(self._state_lock.fileno(),)
        )
        self.stdout.write(self.style.SUCCESS(
            f"\nE31 Network console: http://127.0.0.1:{port}/  ({nodes} local nodes x {gpus_per_node} virtual GPUs)\n"
            "Sign in as 'operator' (operator) or 'demo' (member of team demo). Ctrl-C stops everything.\n"
            f"From a terminal: .venv/bin/e31 login http://127.0.0.1:{port}  (paste a token from the API tokens page)\n"
            f"                 .venv/bin/e31 submit {example} --follow\n"
        ))  # fmt: skip
        _supervise(console)  # starts the children; however it ends, it stops them all
        self._state_lock.close()  # every child has stopped: another console may start

    def _write_example_job(self) -> str:
        """A job file that runs on the local pool as it is, for a first `e31 submit` (kept if edited)."""
        path = settings.STATE_DIR / "hello.toml"
        if not path.exists():
            code = "import os; print('hello from E31'); open(os.environ['E31_OUTPUT_DIR'] + '/hello.txt', 'w').write('hi')"
            path.write_text(
                'name = "hello"\n[work]\nargv = ["/usr/bin/python3", "-c", ' + json.dumps(code) + ']\n'
                '[request]\ngpus = 1\nhours = 0.1\n'
                f'[output]\nuri = "file://{settings.E31_OUTPUT_ROOTS[0]}/demo/hello"\nbytes = "1 MB"\n'
            )  # fmt: skip
        return os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)


def _check_port(port: str) -> None:
    """CommandError unless the web server can listen on 127.0.0.1:``port`` (bound and let go here, as gunicorn
    binds it: with SO_REUSEADDR, so a port a moment ago closed is not taken for busy)."""
    try:
        number = int(port)
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", number))
    except OSError as exc:
        raise CommandError(
            f"port {port} cannot be listened on ({exc.strerror}): another program may be using it. "
            "Stop it, or pick another port: PORT=8001 make run"
        ) from None
    except (ValueError, OverflowError):
        raise CommandError(
            f"port {port} is not a port number (0-65535): pick one, e.g. PORT=8001 make run"
        ) from None


def _lock_state_dir(state_dir: Path) -> TextIO:
    """One console per state folder: a second would start another beat on the same schedule file and agents
    under the same node names, whose registration loses the first agents' jobs. The kernel drops the lock
    with the last process holding it (this one and its children, which inherit it), however they end, so a
    console that crashed never blocks the next one once its children are gone."""
    state_dir.mkdir(parents=True, exist_ok=True)
    lock = open(state_dir / "console.lock", "a")  # kept open: closing it drops the lock
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise CommandError(
            f"another console is running on {state_dir}; stop it first, or set E31_STATE_DIR to another folder"
        ) from None
    return lock


# HUP too: the terminal that runs `make run` closed or its SSH session dropped. Left to its default it
# would end the console alone, and gunicorn (which takes HUP as "reload") would run on, orphaned.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _supervise(console: supervisor.Supervisor) -> None:
    """Starts the children and keeps them up until a stop signal; however this ends, it stops them all."""
    stopping = False

    def stop(*_) -> None:
        nonlocal stopping
        stopping = True

    for signum in STOP_SIGNALS:  # before the first child starts, so no stop can find them unwatched
        # One the console was started ignoring stays ignored (`nohup make run &`: outlive the terminal).
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, stop)
    try:
        console.start_all()
        while not stopping:
            console.tick()
            time.sleep(0.5)
    finally:
        log.info("stopping the console")
        console.stop_all()


def _report(children: list[supervisor.Child]) -> None:
    """The health page's view of the console; a busy database must not stop the supervisor."""
    ok, detail = supervisor.summary(children, time.monotonic())
    try:
        services.record_probe(name=supervisor.PROBE, ok=ok, detail=detail, now=timezone.now())
    except DatabaseError as exc:
        log.warning("could not record the console's state for the health page: %s", exc)
