"""A registry login reaches skopeo in an auth file of the pull's own, never on a command line or in its environment."""

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.utils import timezone

from accounts import team_secrets
from jobs import image_staging, imageref, transfers
from jobs.transfers import registry

PASSWORD = "s3cret-never-in-ps"
UNCAPPED = registry.Cap(2**62, "no cap")


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


@pytest.mark.django_db
def test_a_teams_registry_secret_is_its_login_there_and_no_one_elses(
    monkeypatch, settings, team, other_team, team_admin
):
    """REGISTRY_<host> ("user:password"), entered like any team secret, is the login its pulls use."""
    settings.E31_SECRETS_KEYS = [Fernet.generate_key().decode()]
    settings.E31_ALLOW_PRIVATE_SOURCES = True
    settings.E31_OUTSIDE_REGISTRIES = True
    name = team_secrets.registry_secret_name("registry.example.com:5000")
    assert name == "REGISTRY_REGISTRY_EXAMPLE_COM___5000"
    team_secrets.set_secret(
        team=team, name=name, value=f"team-bot:{PASSWORD}", user=team_admin, now=timezone.now()
    )
    monkeypatch.setattr(image_staging.sources, "checked_addresses", lambda *args, **kwargs: None)
    ref = imageref.parse("registry.example.com:5000/team/app:1")
    access = image_staging.registry_access(team_id=team.id, ref=ref)
    assert (access.username, access.password) == ("team-bot", PASSWORD)
    other = image_staging.registry_access(team_id=other_team.id, ref=ref)
    assert (other.username, other.password) == (
        "",
        "",
    )  # another team pulls anonymously, never with this login
    elsewhere = image_staging.registry_access(
        team_id=team.id, ref=imageref.parse("registry.example.com/app:1")
    )
    assert (elsewhere.username, elsewhere.password) == ("", "")  # another registry (port) gets no login


def stand_in_umoci(monkeypatch, folder: Path, script: str) -> None:
    """``umoci`` on PATH as a shell script: $5 is the bundle it is asked to unpack into."""
    fake = folder / "umoci"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")


def test_an_unpacked_image_keeps_no_setuid_file_and_no_world_writable_folder(monkeypatch, tmp_path):
    """umoci --rootless restores an image's modes: a 4755 file would be setuid to the stager on the node."""
    bundle = tmp_path / "bundle"
    stand_in_umoci(  # what such an image unpacks to
        monkeypatch, tmp_path / "bin",
        'root="$5/rootfs"\nmkdir -p "$root/bin" "$root/tmp"\nprintf "\\177ELF" > "$root/bin/su"\n'
        'chmod 6755 "$root/bin/su"\nchmod 1777 "$root/tmp"\nln -s /bin/su "$root/bin/sh"\n',
    )  # fmt: skip
    registry.unpack(tmp_path / "layout", bundle, beat=lambda: None, cap=UNCAPPED)
    assert oct((bundle / "rootfs" / "bin" / "su").stat().st_mode & 0o7777) == oct(0o755)
    assert oct((bundle / "rootfs" / "tmp").stat().st_mode & 0o7777) == oct(0o1775)
    assert (bundle / "rootfs" / "bin" / "sh").is_symlink()


def test_a_failed_unpack_says_umocis_last_word_and_a_long_one_beats_meanwhile(monkeypatch, tmp_path):
    stand_in_umoci(
        monkeypatch, tmp_path / "bin",
        'sleep 1.2\necho "reading layer" >&2\necho "umoci: layer sha256:ab is corrupt" >&2\nexit 1\n',
    )  # fmt: skip
    beats = []
    with pytest.raises(
        transfers.TransferFailed, match=r"^unpacking failed: umoci: layer sha256:ab is corrupt$"
    ):
        registry.unpack(tmp_path / "layout", tmp_path / "bundle", beat=lambda: beats.append(1), cap=UNCAPPED)
    assert len(beats) >= 2  # every PROGRESS_EVERY_S (0.5 s) of the 1.2 s it ran


@pytest.mark.django_db
def test_a_registry_login_is_never_sent_to_a_look_alike_registry(monkeypatch, settings, team, team_admin):
    """A team stores its login for registry.corp.example.com; a job file (a typo, or one copied from elsewhere)
    names registry.corp-example.com, another domain anyone may register: its pull there is anonymous."""
    settings.E31_SECRETS_KEYS = [Fernet.generate_key().decode()]
    settings.E31_OUTSIDE_REGISTRIES = True
    monkeypatch.setattr(image_staging.sources, "checked_addresses", lambda *args, **kwargs: ["93.184.216.34"])
    name = team_secrets.registry_secret_name("registry.corp.example.com")
    team_secrets.set_secret(
        team=team, name=name, value=f"ci-bot:{PASSWORD}", user=team_admin, now=timezone.now()
    )
    own = image_staging.registry_access(
        team_id=team.id, ref=imageref.parse("registry.corp.example.com/ml/app:1")
    )
    assert (own.username, own.password) == ("ci-bot", PASSWORD)
    look_alike = image_staging.registry_access(
        team_id=team.id, ref=imageref.parse("registry.corp-example.com/ml/app:1")
    )
    assert (look_alike.username, look_alike.password) == ("", "")


@pytest.mark.parametrize(
    "hosts",
    [("a.b.example.com", "a-b.example.com", "a--b.example.com"), ("reg.example.com:5000", "reg.example.com.5000"),
     ("10.0.0:5", "10.0.0.5")],
)  # fmt: skip
def test_no_two_registry_hosts_share_a_secret_name(hosts):
    assert len({team_secrets.registry_secret_name(host) for host in hosts}) == len(hosts)


@pytest.mark.django_db
def test_a_job_whose_submitter_may_no_longer_act_for_the_team_never_pulls_with_its_login(
    monkeypatch, settings, team, team_admin, member
):
    """Reproduction: a queued job's submitter deactivated, its image was still pulled with the team's registry
    login (its run was refused at start, but the login was used for it)."""
    from jobs.models import ImagePull
    from tests.factories import JobFactory

    settings.E31_SECRETS_KEYS = [Fernet.generate_key().decode()]
    settings.E31_POOL_REGISTRIES = ["registry.example.com"]
    name = team_secrets.registry_secret_name("registry.example.com")
    team_secrets.set_secret(
        team=team, name=name, value=f"team-bot:{PASSWORD}", user=team_admin, now=timezone.now()
    )
    asked = []
    monkeypatch.setattr(registry, "resolve", lambda ref, access: asked.append(access.username))
    job = JobFactory(team=team, submitted_by=member, image="registry.example.com/team/app:1", state="staging")
    member.is_active = False
    member.save()
    with pytest.raises(image_staging.ImageFailed, match=r"the account \w+ is deactivated"):
        image_staging.stage_image(job_id=job.id)
    assert asked == []
    assert "deactivated" in ImagePull.objects.get(job=job).stage_detail
