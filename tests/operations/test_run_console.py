"""`make run` refuses at once, saying what to change, where its local nodes could never run a job; and
however it stops, it stops its children."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from accounts.models import Membership
from jobs import dispatch
from operations.management.commands import run_console
from tests.e2e.embedded import free_port, state_dir_job_uids_can_pass


def test_a_state_folder_job_uids_cannot_reach_is_refused_before_anything_starts(settings):
    base = state_dir_job_uids_can_pass("closed")  # passable, unlike pytest's own 0700 temporary root
    closed = base / "home"
    closed.mkdir(mode=0o700)  # a home folder as most systems make it
    settings.STATE_DIR = closed / "var"
    settings.STATE_DIR.mkdir()
    try:
        with pytest.raises(CommandError, match=rf"cannot pass through {closed} .*chmod o\+x {closed}\)"):
            call_command("run_console", "--port", "0")
        assert list(settings.STATE_DIR.iterdir()) == []  # nothing migrated, written or started
    finally:
        shutil.rmtree(base)


@pytest.mark.parametrize("port", ["taken", "http", "70000"])
def test_a_port_the_web_server_cannot_take_is_refused_before_anything_starts(settings, monkeypatch, port):
    """Reproduction: with another program on port 8000 the console printed "http://127.0.0.1:8000/" (which
    reached that other program) while gunicorn failed on "Connection in use" and was restarted every 30 s for
    ever; the health page that would have said so is served by that web server."""
    monkeypatch.setattr(run_console, "_supervise", lambda console: pytest.fail("the children were started"))
    base = state_dir_job_uids_can_pass("port")
    settings.STATE_DIR = base / "var"
    settings.STATE_DIR.mkdir()
    try:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            asked = str(taken.getsockname()[1]) if port == "taken" else port
            with pytest.raises(CommandError, match=rf"(?s)port {asked}\b.*PORT="):
                call_command("run_console", "--port", asked, stdout=StringIO())
        assert [p.name for p in settings.STATE_DIR.iterdir()] == [
            "console.lock"
        ]  # nothing migrated or written
    finally:
        shutil.rmtree(base)


@pytest.mark.django_db
def test_a_restart_of_the_console_puts_back_a_demo_role_the_operator_changed(settings):
    """In the embedded console an operator demotes 'demo' from admin to plain member of team demo.
    The next `make run` (run_console calls ensure_demo_accounts on every start) makes 'demo' an admin
    again: the operator's change is silently lost across the restart, although the command says
    existing demo accounts are left as they are."""
    settings.E31_DEMO_PASSWORD = ""
    call_command("ensure_demo_accounts", stdout=StringIO())
    membership = Membership.objects.get(team__slug="demo", user__username="demo")
    membership.role = Membership.Role.MEMBER
    membership.save()
    call_command("ensure_demo_accounts", stdout=StringIO())  # the console starts again
    membership.refresh_from_db()
    assert membership.role == Membership.Role.MEMBER


@dataclass
class Started:
    commands: dict
    env: dict


@pytest.fixture
def recorded_children(settings, monkeypatch):
    """``run_console`` on a state folder of its own, its children recorded instead of started (and not
    supervised: a test sets ``run_console._supervise`` to do more); what each console started, in order."""
    base = state_dir_job_uids_can_pass("children")
    settings.STATE_DIR = base / "var"
    settings.STATE_DIR.mkdir()
    started: list[Started] = []

    class RecordingSupervisor:
        def __init__(self, commands, *, env, report, pass_fds=()):
            started.append(Started(commands, env))

    monkeypatch.setattr(run_console.supervisor, "Supervisor", RecordingSupervisor)
    monkeypatch.setattr(run_console, "_supervise", lambda console: None)
    monkeypatch.setattr(run_console.sandbox, "refusal", lambda **_: "")
    yield started
    shutil.rmtree(base)


@pytest.mark.django_db
def test_a_second_console_on_the_same_state_folder_is_refused(recorded_children, monkeypatch):
    """A user runs `make run` in a second terminal while the first console still runs on the same
    E31_STATE_DIR. Nothing stops it: the second console starts another web, another worker, another
    beat on the same celerybeat-schedule file and a second agent for each of local-1 and local-2, whose
    registration loses every job the first agents are running (and both consume node.local-1). A second
    console on a folder in use should be refused before it starts anything."""
    outcome: dict = {}

    def supervise(console):
        if len(recorded_children) > 1:
            return  # the second console got this far: it started its children
        try:  # while the first console runs, the user starts a second one on the same folder
            call_command("run_console", "--port", "0", stdout=StringIO())
            outcome["second"] = "started"
        except CommandError as exc:
            outcome["second"] = f"refused: {exc}"

    monkeypatch.setattr(run_console, "_supervise", supervise)
    call_command("run_console", "--port", "0", stdout=StringIO())
    assert len(recorded_children) == 1, "a second console started its own web, worker, beat and node agents"
    assert outcome["second"].startswith("refused")


@pytest.mark.django_db
def test_the_console_serves_every_queue_the_product_rings_on_each_by_a_worker_of_its_own(recorded_children):
    """Control, staging and notifications each have their own worker: a long copy or a webhook receiver that
    never answers holds none of the control worker's threads."""
    call_command("run_console", "--port", "0", stdout=StringIO())
    commands = recorded_children[0].commands
    served = [argv[argv.index("--queues") + 1] for argv in commands.values() if "--queues" in argv]
    assert sorted(served) == sorted(
        [dispatch.control_queue(), dispatch.staging_queue(), dispatch.notify_queue()]
    )


ROOT = Path(__file__).resolve().parents[2]

CONSOLE = textwrap.dedent("""
    import os, sys
    import django
    django.setup()
    from operations import supervisor
    from operations.management.commands import run_console
    # -c: an empty config of its own; gunicorn would else read the checkout's gunicorn.conf.py (it starts in the
    # console's folder), whose on_starting hook checks a database this toy app has not got.
    web = [sys.executable, "-m", "gunicorn", "-c", sys.argv[1] + "/gunicorn.conf.py", "--chdir", sys.argv[1],
           "app:app", "--bind", "127.0.0.1:0", "--workers", "1", "--pid", sys.argv[1] + "/gunicorn.pid"]
    console = supervisor.Supervisor({"web": web}, env=dict(os.environ), report=lambda children: None)
    console.start_all()
    print("started", flush=True)
    run_console._supervise(console)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(60)
def test_a_hangup_stops_the_web_server_with_the_console(tmp_path):
    """The operator closes the terminal (or the SSH session drops) that runs `make run`: the shell sends
    SIGHUP to the job's process group. Were the console to die of it at once, gunicorn's master (which takes
    HUP as "reload") would run on, orphaned, on the console's port and holding the state folder's lock, and
    the next `make run` would be refused. The console treats HUP like TERM: it stops every child."""
    (tmp_path / "app.py").write_text(
        "def app(environ, start_response):\n    start_response('200 OK', [])\n    return [b'ok']\n"
    )
    (tmp_path / "gunicorn.conf.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "E31_TEST_DB_NAME")}
    env |= {"DJANGO_SETTINGS_MODULE": "e31web.settings", "E31_STATE_DIR": str(tmp_path / "var"),
            "CELERY_BROKER_URL": "filesystem://", "PYTHONUNBUFFERED": "1"}  # fmt: skip
    console = subprocess.Popen(
        [sys.executable, "-c", CONSOLE, str(tmp_path)], cwd=ROOT, env=env, start_new_session=True,
        stdout=open(tmp_path / "console.log", "wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    pid_file, log = tmp_path / "gunicorn.pid", tmp_path / "console.log"
    try:
        deadline = time.monotonic() + 30
        while (
            b"Listening at" not in log.read_bytes() and console.poll() is None and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        # gunicorn logs it once its signal handlers are in: the master is up, and HUP to it means "reload"
        assert b"Listening at" in log.read_bytes(), f"gunicorn never started:\n{log.read_text()}"
        master = int(pid_file.read_text())
        assert _alive(master) and console.poll() is None, (
            f"gunicorn or the console stopped:\n{log.read_text()}"
        )
        time.sleep(0.5)  # its worker has booted
        os.killpg(console.pid, signal.SIGHUP)  # the terminal hangs up on the whole job
        console.wait(timeout=20)
        deadline = time.monotonic() + 8
        while _alive(master) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(master), "gunicorn's master outlived the console: orphaned after a hangup"
    finally:
        try:  # everything the console started is still in its process group
            os.killpg(console.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        console.wait()


NOHUP_CONSOLE = textwrap.dedent("""
    import os, sys
    import django
    django.setup()
    from operations import supervisor
    from operations.management.commands import run_console
    child = [sys.executable, "-c",
             "import os, time; open(os.environ['PID_FILE'], 'w').write(str(os.getpid())); time.sleep(120)"]
    console = supervisor.Supervisor({"web": child}, env=dict(os.environ), report=lambda children: None)
    run_console._supervise(console)
""")


def _as_nohup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup(1) does before it runs the command


@pytest.mark.timeout(60)
def test_a_console_started_under_nohup_outlives_the_hangup(tmp_path):
    """`nohup make run &` asks the console to outlive the terminal: nohup leaves SIGHUP ignored, and the console
    (like make and sh) keeps it so, rather than stopping itself and its children when the shell hangs up."""
    pid_file = tmp_path / "child.pid"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "E31_TEST_DB_NAME")}
    env |= {"DJANGO_SETTINGS_MODULE": "e31web.settings", "E31_STATE_DIR": str(tmp_path / "var"),
            "CELERY_BROKER_URL": "filesystem://", "PID_FILE": str(pid_file)}  # fmt: skip
    console = subprocess.Popen(
        [sys.executable, "-c", NOHUP_CONSOLE], cwd=ROOT, env=env, start_new_session=True, preexec_fn=_as_nohup,
        stdout=open(tmp_path / "console.log", "wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        child = int(pid_file.read_text())
        os.killpg(console.pid, signal.SIGHUP)  # the login shell hangs up on the job
        time.sleep(2.0)
        assert console.poll() is None, "the console started under nohup stopped on the hangup"
        assert _alive(child), "the console's child did not outlive the hangup nohup asked it to ignore"
    finally:
        try:
            os.killpg(console.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        console.wait()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("set_by_user", "expected"), [(None, "http://127.0.0.1:{port}"), ("https://e31.example", "")]
)
def test_links_in_the_consoles_mail_point_at_the_port_it_serves(
    recorded_children, monkeypatch, set_by_user, expected
):
    """After `PORT=8107 make run`, an invitation e-mailed by the console linked to http://127.0.0.1:8000/invite/…,
    where nothing answers: the children were not told the port. An address the user set stays theirs."""
    if set_by_user:
        monkeypatch.setenv("E31_CONSOLE_URL", set_by_user)
    else:
        monkeypatch.delenv("E31_CONSOLE_URL", raising=False)
    port = free_port()
    call_command("run_console", "--port", str(port), stdout=StringIO())
    assert recorded_children[0].env["E31_CONSOLE_URL"] == (expected.format(port=port) or set_by_user)
