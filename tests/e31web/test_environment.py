"""Every setting the README's configuration table names is read from the environment.

Settings are read once at start-up, so each check runs a fresh Python process.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import django, json
django.setup()
from accounts import members, views
from public import services
print(json.dumps([
    views._invite_limit(), views._invite_window_s(),
    members.invitation_ttl().total_seconds(), services._invitation_ttl().total_seconds(),
]))
"""


def _read(tmp_path, **values: str) -> list:
    env = {k: v for k, v in os.environ.items() if not k.startswith("E31_")}
    env |= {"DJANGO_SETTINGS_MODULE": "e31web.settings", "E31_STATE_DIR": str(tmp_path / "state"), **values}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_invitation_limits_and_lifetime_default_to_twenty_an_hour_and_seven_days(tmp_path):
    assert _read(tmp_path) == [20, 3600, 7 * 86400, 7 * 86400]


def test_the_invitation_limits_and_lifetime_are_set_by_the_environment(tmp_path):
    values = {"E31_TEAM_INVITE_LIMIT": "3", "E31_TEAM_INVITE_WINDOW_S": "120", "E31_INVITATION_TTL_S": "3600"}
    assert _read(tmp_path, **values) == [3, 120, 3600, 3600]
