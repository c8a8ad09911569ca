"""`e31 submit --wait`, `--follow` and `e31 logs -f` outlast a console restarting: while they wait, a console
that cannot be reached is asked again with backoff for up to five minutes, said once on stderr, and said again
when it answers. A refused token or a missing job ends the command at once, and nothing that changes state (a
submit, a cancel) is sent again by this patience: only the reads that poll."""

import io
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from e31cli import client, main

JOB = {
    "id": 7, "name": "train", "state": "running", "end_reason": "", "exit_code": None, "delivery_state": "",
    "array": None, "rerun_of": None, "budget_note": "",
}  # fmt: skip
DONE = {**JOB, "state": "released", "end_reason": "succeeded", "exit_code": 0, "delivery_state": "delivered"}
REFUSED = "HTTPConnectionPool(host='127.0.0.1', port=8000): Max retries exceeded (Caused by NewConnectionError(\
'<urllib3.connection.HTTPConnection object>: Failed to establish a new connection: [Errno 111] Connection refused'))"


class Clock:
    """main's ``time``: sleeps pass at once, counted, and each may run what the test planned for it."""

    def __init__(self, plan: dict | None = None) -> None:
        self.now, self.slept, self.plan = 1000.0, [], plan or {}

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if action := self.plan.get(len(self.slept)):
            action()


@pytest.fixture
def clock(monkeypatch):
    made = Clock()
    monkeypatch.setattr(main, "time", made)
    monkeypatch.setattr(client, "time", made)  # an idempotent POST's own retries, also at once
    return made


def e31(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``e31 ARGS`` as the installed command runs it."""
    monkeypatch.setattr(sys, "argv", ["e31", *args])
    with pytest.raises(SystemExit) as exit_:
        main.run()
    seen = capsys.readouterr()
    return exit_.value.code, seen.out, " ".join(seen.err.split())


def json_answer(request_url: str, status: int, body: dict) -> requests.Response:
    response = requests.Response()
    response.status_code, response.url = status, request_url
    response.headers["Content-Type"] = "application/json"
    response.raw = io.BytesIO(json.dumps(body).encode())
    return response


def console(monkeypatch, answers):
    """Each request answered by the next of ``answers`` for its method: a dict (200), a (status, dict), or an
    exception raised as requests would. Returns the (method, path) of every request sent."""
    sent = []

    def request(self, method, url, **kwargs):
        sent.append((method, url.split("/api/v1", 1)[1]))
        answer = answers[method].pop(0) if len(answers[method]) > 1 else answers[method][0]
        if isinstance(answer, Exception):
            raise answer
        status, body = answer if isinstance(answer, tuple) else (200, answer)
        return json_answer(url, status, body)

    monkeypatch.setenv("E31_URL", "https://console.test")
    monkeypatch.setenv("E31_TOKEN", "e31_x")
    monkeypatch.setattr(requests.Session, "request", request)
    return sent


@pytest.fixture
def job_file(tmp_path):
    path = tmp_path / "train.toml"
    path.write_text('name = "train"\n')
    return path


class Restarting(BaseHTTPRequestHandler):
    """The console's API for one job: submitted, then running, then succeeded. HTTP/1.0, one connection per
    request, so a console that went away refuses the next one as a restarting server does."""

    gets: list[str]

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._json(201, {**JOB, "state": "queued"})

    def do_GET(self) -> None:
        self.gets.append(self.path)
        self._json(200, JOB if len(self.gets) == 1 else DONE)

    def log_message(self, *args) -> None:
        pass


def test_submit_wait_outlasts_a_console_restart_and_says_so_once(monkeypatch, capsys, clock, job_file):
    """The web server restarted for a few seconds during a deploy: `--wait` died with exit 7 "Cannot reach the
    console: ... Connection refused" after the client's 3.5 s of retries, although the job ran on and succeeded."""
    handler = type("Handler", (Restarting,), {"gets": []})
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), handler)]
    port = servers[0].server_address[1]

    def serve() -> None:
        threading.Thread(target=servers[-1].serve_forever, daemon=True).start()

    def stop() -> None:
        servers[-1].shutdown()
        servers[-1].server_close()

    def restart() -> None:
        servers.append(ThreadingHTTPServer(("127.0.0.1", port), handler))
        serve()

    serve()
    # The first pause of the wait stops the console; it is back after three pauses of the retries.
    clock.plan = {1: stop, 4: restart}
    monkeypatch.setattr(
        client, "READ_RETRY", client.READ_RETRY.new(backoff_factor=0)
    )  # the client's own, at once
    monkeypatch.setenv("E31_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("E31_TOKEN", "e31_x")
    try:
        code, _, stderr = e31(monkeypatch, capsys, "submit", str(job_file), "--wait")
    finally:
        stop()
    assert code == 0, stderr
    assert (
        stderr.count("Cannot reach the console (Connection refused): trying again for up to 5 minutes") == 1
    ), stderr
    assert "The console answers again" in stderr and "Job 7 released: succeeded" in stderr, stderr
    assert handler.gets == ["/api/v1/jobs/7", "/api/v1/jobs/7"]
    assert clock.slept == [main.WAIT_POLL_S, 1, 2, 4]  # the wait's pause, then backoff until it answered


def test_a_console_still_unreachable_after_five_minutes_exits_7(monkeypatch, capsys, clock, job_file):
    sent = console(monkeypatch, {"POST": [(201, JOB)], "GET": [requests.ConnectionError(REFUSED)]})
    code, _, stderr = e31(monkeypatch, capsys, "submit", str(job_file), "--wait")
    assert code == main.EXIT_UNREACHABLE, stderr
    assert stderr.count("trying again for up to 5 minutes") == 1, stderr
    assert stderr.endswith("Connection refused'))"), stderr  # the last error, as before
    assert sum(clock.slept) == main.UNREACHABLE_PATIENCE_S == 300
    assert max(clock.slept) <= 30  # it keeps asking, not once at the end
    assert sent[0] == ("POST", "/jobs/file") and sent.count(("POST", "/jobs/file")) == 1


@pytest.mark.parametrize("how", ["timeout", "gateway", "throttled"])
def test_a_timeout_a_gateways_page_and_a_throttle_are_waited_out_too(
    monkeypatch, capsys, clock, job_file, how
):
    """What exits 7 is what is waited out: a console behind a load balancer answers 502 while it restarts."""
    failure = {
        "timeout": requests.ReadTimeout("Read timed out."),
        "gateway": client.ApiError(502, "<html>Bad Gateway</html>", from_console=False),
        "throttled": client.ApiError(429, "Too many requests."),
    }[how]
    console(monkeypatch, {"POST": [(201, JOB)], "GET": [failure, failure, DONE]})
    code, _, stderr = e31(monkeypatch, capsys, "submit", str(job_file), "--wait")
    assert code == 0, stderr
    assert "trying again for up to 5 minutes" in stderr and "The console answers again" in stderr, stderr


@pytest.mark.parametrize(
    "status, body, exits",
    [
        (401, {"detail": "Invalid token."}, main.EXIT_AUTH),
        (404, {"detail": "Not found."}, main.EXIT_NOT_FOUND),
    ],
)
def test_a_refused_token_or_a_missing_job_is_not_waited_out(
    monkeypatch, capsys, clock, job_file, status, body, exits
):
    sent = console(monkeypatch, {"POST": [(201, JOB)], "GET": [(status, body)]})
    code, _, stderr = e31(monkeypatch, capsys, "submit", str(job_file), "--wait")
    assert code == exits, stderr
    assert "trying again" not in stderr and clock.slept == []
    assert sent == [("POST", "/jobs/file"), ("GET", "/jobs/7")]


def test_logs_follow_outlasts_a_console_restart(monkeypatch, capsys, clock):
    def chunk(text: str, offset: int, *, complete: bool) -> dict:
        return {"attempt": 1, "next_offset": offset, "text": text, "complete": complete, "retry_after_s": 0}

    down = requests.ConnectionError(REFUSED)
    console(
        monkeypatch,
        {"GET": [chunk("one\n", 4, complete=False), down, down, chunk("two\n", 8, complete=True)]},
    )
    code, stdout, stderr = e31(monkeypatch, capsys, "logs", "7", "-f")
    assert (code, stdout) == (0, "one\ntwo\n"), stderr
    assert stderr.count("trying again") == 1 and "The console answers again" in stderr, stderr


@pytest.mark.parametrize("args", [["logs", "7"], ["show", "7"], ["cancel", "7"]])
def test_a_command_that_does_not_wait_is_not_kept_waiting(monkeypatch, capsys, clock, args):
    """Without --wait or --follow the answer is wanted now; and a cancel changes state: never sent again blindly."""
    down = requests.ConnectionError(REFUSED)
    sent = console(monkeypatch, {"GET": [down], "POST": [down]})
    code, _, stderr = e31(monkeypatch, capsys, *args)
    assert code == main.EXIT_UNREACHABLE, stderr
    assert "trying again" not in stderr and len(sent) == 1 and clock.slept == []


def test_a_submit_the_console_never_answered_is_not_kept_waiting(monkeypatch, capsys, clock, job_file):
    """The submit itself is retried only as before (its Idempotency-Key makes that safe): a few times, then exit 7."""
    sent = console(monkeypatch, {"POST": [requests.ConnectionError(REFUSED)], "GET": [DONE]})
    code, _, stderr = e31(monkeypatch, capsys, "submit", str(job_file), "--wait")
    assert code == main.EXIT_UNREACHABLE, stderr
    assert "trying again" not in stderr
    assert sent == [("POST", "/jobs/file")] * client.RETRIES
