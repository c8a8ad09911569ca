"""`make run`'s console with no service at all: SQLite, the filesystem broker, beat and a local pool."""

import http.cookiejar
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.embedded import embedded_console

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """One console for the module: starting it (migrate, five processes) is the slow part."""
    with embedded_console(tmp_path_factory.mktemp("embedded")) as console:
        yield console.base, console.env, console.log_path


def test_the_embedded_console_serves_prints_the_demo_users_and_runs_a_job(embedded):
    base, env, log_path = embedded
    output = log_path.read_text()
    assert "created 'operator' with password demo-pass-123" in output
    assert "created 'demo' with password demo-pass-123" in output
    token = subprocess.run(
        [sys.executable, "manage.py", "create_api_token", "demo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    out_root = Path(env["E31_STATE_DIR"]) / "outputs" / "demo"  # the demo team's folder
    body = {
        "name": "embedded", "work": {"argv": ["/usr/bin/python3", "-c", "print('hello from the local pool')"]},
        "request": {"gpus": 2, "hours": 0.1}, "output": {"uri": f"file://{out_root}/embedded", "bytes": 10},
    }  # fmt: skip
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    deadline = time.monotonic() + 30  # the agents register a moment after the web process answers
    while True:
        request = urllib.request.Request(
            base + "/api/v1/jobs", data=json.dumps(body).encode(), headers=headers
        )
        try:
            job = json.load(urllib.request.urlopen(request, timeout=10))
            break
        except urllib.error.HTTPError as exc:
            if exc.code != 422 or time.monotonic() > deadline:
                raise
            time.sleep(1)
    deadline = time.monotonic() + 60
    while job["state"] != "released" and time.monotonic() < deadline:
        time.sleep(0.5)
        get = urllib.request.Request(f"{base}/api/v1/jobs/{job['id']}", headers=headers)
        job = json.load(urllib.request.urlopen(get, timeout=10))
    assert (job["state"], job["end_reason"]) == ("released", "succeeded"), job


def test_the_demo_member_can_sign_in_and_open_the_form(embedded):
    base, _, _ = embedded
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(base + "/accounts/login/").read().decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    data = urllib.parse.urlencode(
        {"username": "demo", "password": "demo-pass-123", "csrfmiddlewaretoken": csrf}
    ).encode()
    request = urllib.request.Request(
        base + "/accounts/login/", data=data, headers={"Referer": base + "/accounts/login/"}
    )
    landed = opener.open(request).read().decode()
    assert "Jobs" in landed and "demo" in landed
    assert "Submit the job" in opener.open(base + "/jobs/new/").read().decode()


def test_the_readme_path_login_and_submit_the_example_from_the_terminal(embedded, tmp_path):
    """`make run`, then `e31 login URL` and `e31 submit var/hello.toml --follow`, as the README shows."""
    base, env, log_path = embedded
    assert "e31 submit" in log_path.read_text()
    token = subprocess.run(
        [sys.executable, "manage.py", "create_api_token", "demo"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    cli_env = {**env, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    e31 = [sys.executable, "-m", "e31cli"]
    login = subprocess.run(
        [*e31, "login", base], input=token + "\n", cwd=ROOT, env=cli_env, capture_output=True, text=True
    )
    assert login.returncode == 0, login.stderr
    example = Path(env["E31_STATE_DIR"]) / "hello.toml"
    run = subprocess.run(
        [*e31, "submit", str(example), "--follow"],
        cwd=ROOT,
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "hello from E31\n"
