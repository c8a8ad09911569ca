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
from urllib3.exceptions import MaxRetryError, SSLError

from e31cli import client, config


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
            self.send_response(503)
            self.send_header("Content-Length", "0")
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


def test_a_tls_failure_once_a_post_may_have_been_sent_is_not_retried():
    """urllib3 counts TLS errors as "other" errors and retries those whatever the method."""
    with pytest.raises(MaxRetryError):
        client.READ_RETRY.increment(
            method="POST", url="/api/v1/jobs/1/cancel", error=SSLError("bad record mac")
        )
