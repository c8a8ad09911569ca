"""A registry login reaches skopeo in an auth file of the pull's own, never on a command line or in its environment."""

import base64
import json
import subprocess
from pathlib import Path

from jobs import imageref
from jobs.transfers import registry

PASSWORD = "s3cret-never-in-ps"


def test_the_login_goes_in_a_private_auth_file_and_never_on_the_command_line(monkeypatch):
    seen = {}

    def fake_run(argv, **kwargs):
        auth = Path(next(a for a in argv if a.startswith("--authfile=")).split("=", 1)[1])
        seen.update(
            argv=argv, env=kwargs["env"], mode=auth.stat().st_mode & 0o777, auth=json.loads(auth.read_text())
        )
        return subprocess.CompletedProcess(argv, 0, stdout=b'{"config": {}, "layers": []}', stderr=b"")

    monkeypatch.setattr(registry.subprocess, "run", fake_run)
    access = registry.Access(username="team-bot", password=PASSWORD)
    registry.resolve(imageref.parse("registry.example.com/team/app:1"), access=access)
    assert not any(PASSWORD in arg for arg in seen["argv"]) and PASSWORD not in json.dumps(seen["env"])
    assert seen["mode"] == 0o600
    token = seen["auth"]["auths"]["registry.example.com"]["auth"]
    assert base64.b64decode(token).decode() == f"team-bot:{PASSWORD}"
    assert PASSWORD not in repr(access)


def test_an_anonymous_pull_carries_an_empty_auth_file_so_the_nodes_own_login_is_never_used(monkeypatch):
    seen = {}

    def fake_run(argv, **kwargs):
        auth = Path(next(a for a in argv if a.startswith("--authfile=")).split("=", 1)[1])
        seen.update(auth=json.loads(auth.read_text()), home=kwargs["env"]["HOME"])
        return subprocess.CompletedProcess(argv, 0, stdout=b'{"config": {}, "layers": []}', stderr=b"")

    monkeypatch.setattr(registry.subprocess, "run", fake_run)
    registry.resolve(imageref.parse("registry.example.com/team/app:1"), access=registry.Access())
    assert seen["auth"] == {} and seen["home"] != str(Path.home())
