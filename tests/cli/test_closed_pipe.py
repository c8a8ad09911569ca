"""`e31 … | head` ends quietly with 141, as a program that SIGPIPE ended does: exit 1 (click's answer to EPIPE) is
what the CLI's documentation calls an API error, and a script's `set -o pipefail` took it for one."""

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from e31cli import main
from tests.cli.test_exit_codes import answered_by_adapter, exit_of

ROOT = Path(__file__).resolve().parents[2]
LINES = "".join(f"step {i} of a long log\n" for i in range(4000))  # ~100 KB a read: more than a pipe holds


class Endless(BaseHTTPRequestHandler):
    """A job whose log never ends and a team with many big jobs: more than any pipe's buffer."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if "/log" in self.path:
            body = {"attempt": 1, "next_offset": 10**6, "text": LINES, "complete": False, "retry_after_s": 0}
        else:
            items = [{"id": i, "name": "x" * 5000} for i in range(100)]
            body = {"items": items, "count": 10**6}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def endless_console():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize(
    "args", [["logs", "24"], ["logs", "24", "-f"], ["ls", "--json", "--limit", "1000"], ["ls", "--help"]]
)
def test_a_reader_that_stops_early_ends_the_command_quietly_with_141(endless_console, tmp_path, args):
    """`e31 logs 24 | head -2` and `e31 ls --json | head -1` exited 1. Here the reader has gone before the first
    write, so that even help, which a pipe's buffer would hold whole, meets it."""
    env = {**os.environ, "E31_URL": endless_console, "E31_TOKEN": "e31_x", "XDG_CONFIG_HOME": str(tmp_path)}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        e31 = subprocess.run(
            [sys.executable, "-m", "e31cli", *args], cwd=ROOT, env=env, stdout=write_end, stderr=subprocess.PIPE,
            timeout=60,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert e31.returncode == main.EXIT_PIPE_CLOSED == 141, e31.stderr
    assert e31.stderr == b""  # no "Exception ignored … BrokenPipeError", no "Error"


def close_the_reader_of_stdout(monkeypatch, request) -> None:
    """stdout a pipe whose reader has gone: each write that reaches it fails with EPIPE, as under `| head`. Set in
    the test itself: pytest's capture sets sys.stdout again between a fixture and its test."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    stdout = os.fdopen(write_end, "w")
    monkeypatch.setattr(sys, "stdout", stdout)

    def close() -> None:
        try:
            stdout.close()
        except BrokenPipeError:  # what the command left in its buffer
            pass

    request.addfinalizer(close)


@pytest.mark.parametrize(
    "args", [["ls"], ["ls", "--json"], ["show", "7"], ["show", "7", "--json"], ["queue"]]
)
def test_every_command_whose_reader_went_away_exits_141(monkeypatch, capsys, request, args):
    job = {
        "id": 7, "name": "train", "team": "vision", "state": "queued", "end_reason": "", "exit_code": None,
        "request": {"gpus": 1, "hours": 1.0}, "submitted_at": "2026-05-04T14:20:00+00:00", "array": None,
        "estimated_start": None, "pending_reason": "", "paused": "", "end_detail": "", "events": [],
        "work": {"argv": ["python"]}, "output": {"uri": "file:///out"},
    }  # fmt: skip
    answered_by_adapter(monkeypatch, 200, {**job, "items": [job], "count": 1})
    monkeypatch.setenv("E31_URL", "https://console.test")
    monkeypatch.setenv("E31_TOKEN", "e31_x")
    close_the_reader_of_stdout(monkeypatch, request)
    monkeypatch.setattr(
        main.out, "quiet", False
    )  # rich's answer to EPIPE quiets the console for good: restored
    code, stderr = exit_of(monkeypatch, capsys, *args)
    assert (code, stderr) == (141, "")
