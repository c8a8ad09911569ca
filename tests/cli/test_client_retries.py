"""The CLI's reads survive a connection the console drops and a console briefly unable to answer.

A real HTTP server on loopback: the first connection is reset (SO_LINGER 0, as a server closing
a kept-alive connection just as the client reuses it), or answered 503; the read is retried and
gets its answer. A POST without an Idempotency-Key is never repeated.
"""

import json
import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from typer.testing import CliRunner
from urllib3.exceptions import MaxRetryError, SSLError

from e31cli import client, config, main


class Flaky(BaseHTTPRequestHandler):
    """Answers ``{"ok": n}``, except that the first ``failures`` requests fail as ``mode`` says."""

    protocol_version = "HTTP/1.1"
    mode = "reset"
    failures = 1
    seen: list[str]

    def _answer(self) -> None:
        self.seen.append(self.command)
        if len(self.seen) <= self.failures:
            if self.mode == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True
                return
            self.send_response(int(self.mode))
            self.send_header("Content-Length", "0")
            self.send_header("Retry-After", "0")
            self.end_headers()
            return
        body = json.dumps({"ok": len(self.seen)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    def start(mode: str, failures: int):
        handler = type("Handler", (Flaky,), {"mode": mode, "failures": failures, "seen": []})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        return client.Api(config.Login(url=url, token="e31_test"), timeout_s=5), handler.seen

    servers: list[ThreadingHTTPServer] = []
    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("mode", ["reset", "503"])
def test_a_read_is_retried_after_a_reset_connection_or_a_503(server, mode):
    api, seen = server(mode, failures=1)
    assert api.get("/jobs/1/log") == {"ok": 2}
    assert seen == ["GET", "GET"]


def test_a_read_gives_up_after_its_retries_with_the_connection_error(server):
    api, seen = server("reset", failures=100)
    with pytest.raises(requests.ConnectionError):
        api.get("/jobs/1")
    assert len(seen) == client.RETRIES + 1


def test_a_post_without_idempotency_is_sent_once(server):
    api, seen = server("reset", failures=1)
    with pytest.raises(requests.ConnectionError):
        api.post("/jobs/1/cancel")
    assert seen == ["POST"]


def test_an_idempotent_post_is_retried_after_a_429(server):
    api, seen = server("429", failures=1)
    assert api.post("/jobs/file", retry=True) == {"ok": 2}
    assert seen == ["POST", "POST"]


def test_a_tls_failure_once_a_post_may_have_been_sent_is_not_retried():
    """urllib3 counts TLS errors as "other" errors and retries those whatever the method."""
    with pytest.raises(MaxRetryError):
        client.READ_RETRY.increment(
            method="POST", url="/api/v1/jobs/1/cancel", error=SSLError("bad record mac")
        )


JOB = {
    "id": 7, "name": "train", "state": "released", "end_reason": "succeeded", "exit_code": 0,
    "delivery_state": "delivered", "array": None, "rerun_of": None, "budget_note": "",
}  # fmt: skip


class Throttling(BaseHTTPRequestHandler):
    """POST /api/v1/jobs/file makes job 7; the first GET is answered 429 with Retry-After, as the console's
    API throttle answers once a token passes E31_API_RATE; later GETs see the job succeeded."""

    protocol_version = "HTTP/1.1"
    gets: list[str]

    def _json(self, status: int, body: dict, extra: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._json(201, {**JOB, "state": "queued", "end_reason": "", "exit_code": None, "delivery_state": ""})

    def do_GET(self) -> None:
        self.gets.append(self.path)
        if len(self.gets) == 1:
            self._json(429, {"detail": "Too many requests"}, {"Retry-After": "1"})
        else:
            self._json(200, JOB)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def throttling_console():
    handler = type("Handler", (Throttling,), {"gets": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler.gets
    httpd.shutdown()
    httpd.server_close()


def test_submit_wait_does_not_exit_as_a_failed_job_when_one_poll_is_throttled(
    throttling_console, monkeypatch, tmp_path
):
    """A CI runner starts many `e31 submit --wait` with one token; together their polls pass E31_API_RATE
    (600/m) and one poll gets 429 with Retry-After. The CLI neither retries a 429 nor honours
    Retry-After (respect_retry_after_header=False, 429 not in RETRY_STATUSES): the command stops with
    exit 1, which under --wait means "the job failed" (any other failure, or the job's own exit 1),
    although the job succeeded. It should wait as told and exit 0."""
    url, gets = throttling_console
    monkeypatch.setenv("E31_URL", url)
    monkeypatch.setenv("E31_TOKEN", "e31_test")
    monkeypatch.setattr(main, "WAIT_POLL_S", 0.01)
    job_file = tmp_path / "j.toml"
    job_file.write_text('name = "train"\n')
    result = CliRunner().invoke(main.app, ["submit", str(job_file), "--wait"])
    code = result.exit_code
    if isinstance(result.exception, client.ApiError):  # what main.run() turns into an exit code
        code = main._exit_for(result.exception)
    assert code == 0, f"exit {code}: {result.exception or result.stderr}"
    assert len(gets) >= 2
