"""The embedded console restarts a child that dies; the rest keeps serving (issue 15, point 2)."""

import http.cookiejar
import os
import re
import signal
import time
import urllib.parse
import urllib.request

import pytest

from tests.e2e.embedded import demo_token, embedded_console, submit_when_the_pool_is_up

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(360)]


def started_pid(log: str, name: str) -> list[int]:
    return [int(pid) for pid in re.findall(rf"\b{re.escape(name)} started \(pid (\d+)\)", log)]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := predicate():
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def operator_page(base: str, path: str) -> str:
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    page = opener.open(base + "/accounts/login/").read().decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    form = {"username": "operator", "password": "demo-pass-123", "csrfmiddlewaretoken": csrf}
    request = urllib.request.Request(
        base + "/accounts/login/", data=urllib.parse.urlencode(form).encode(),
        headers={"Referer": base + "/accounts/login/"},
    )  # fmt: skip
    opener.open(request).read()
    return opener.open(base + path).read().decode()


def test_a_killed_node_agent_comes_back_and_its_requeueable_job_finishes(tmp_path):
    with embedded_console(tmp_path, E31_LOCAL_NODES="1") as console:
        token = demo_token(console)
        body = {
            "name": "survivor", "work": {"argv": ["/bin/sh", "-c", "sleep 8; echo finished"]},
            "request": {"gpus": 1, "hours": 0.1, "requeue": True},
            "output": {"uri": f"file://{console.state_dir}/outputs/demo/survivor", "bytes": 10},
        }  # fmt: skip
        job_id = submit_when_the_pool_is_up(console, token, body)["id"]
        wait_for(
            lambda: console.api(token, "GET", f"/jobs/{job_id}")[1]["state"] == "running",
            90,
            "the job to run",
        )
        [web_pid] = started_pid(console.log(), "web")
        [agent_pid] = started_pid(console.log(), "local-1")

        os.kill(agent_pid, signal.SIGKILL)

        pids = wait_for(
            lambda: (p := started_pid(console.log(), "local-1")) and len(p) == 2 and p, 60, "a restart"
        )
        assert pids[1] != agent_pid and "local-1 killed by SIGKILL" in console.log()
        job = wait_for(
            lambda: (j := console.api(token, "GET", f"/jobs/{job_id}")[1])["state"] in ("released", "ended") and j,
            150, "the job to end",
        )  # fmt: skip
        assert (job["state"], job["end_reason"], job["attempt"]) == ("released", "succeeded", 2), job
        assert any(e["reason"].startswith("requeued") for e in job["events"]), job["events"]
        assert started_pid(console.log(), "web") == [web_pid]  # the web server never stopped
        os.kill(web_pid, 0)  # and is still there
        health = operator_page(console.base, "/operator/health/")
        assert "Console processes" in health and "local-1: up" in health and "restarted 1 time" in health
