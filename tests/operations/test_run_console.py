"""`make run` refuses at once, saying what to change, where its local nodes could never run a job."""

import shutil
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from accounts.models import Membership
from operations.management.commands import run_console
from tests.e2e.embedded import state_dir_job_uids_can_pass


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


@pytest.mark.django_db
def test_a_second_console_on_the_same_state_folder_is_refused(settings, monkeypatch):
    """A user runs `make run` in a second terminal while the first console still runs on the same
    E31_STATE_DIR. Nothing stops it: the second console starts another web, another worker, another
    beat on the same celerybeat-schedule file and a second agent for each of local-1 and local-2, whose
    registration loses every job the first agents are running (and both consume node.local-1). A second
    console on a folder in use should be refused before it starts anything."""
    base = state_dir_job_uids_can_pass("rev-two")
    settings.STATE_DIR = base / "var"
    settings.STATE_DIR.mkdir()
    started: list[dict] = []
    outcome: dict = {}

    class FakeSupervisor:
        def __init__(self, commands, *, env, report, pass_fds=()):
            started.append(commands)

        def start_all(self):
            pass

    def supervise(console):
        if len(started) > 1:
            return  # the second console got this far: it started its children
        try:  # while the first console runs, the user starts a second one on the same folder
            call_command("run_console", "--port", "0", stdout=StringIO())
            outcome["second"] = "started"
        except CommandError as exc:
            outcome["second"] = f"refused: {exc}"

    monkeypatch.setattr(run_console.supervisor, "Supervisor", FakeSupervisor)
    monkeypatch.setattr(run_console, "_supervise", supervise)
    monkeypatch.setattr(run_console.sandbox, "refusal", lambda **_: "")
    try:
        call_command("run_console", "--port", "0", stdout=StringIO())
    finally:
        shutil.rmtree(base)
    assert len(started) == 1, "a second console started its own web, worker, beat and node agents"
    assert outcome["second"].startswith("refused")
