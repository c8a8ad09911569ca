"""`make run` refuses at once, saying what to change, where its local nodes could never run a job."""

import shutil

import pytest
from django.core.management import CommandError, call_command

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
