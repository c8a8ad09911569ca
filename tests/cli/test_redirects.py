"""A redirect to another host is not followed: the CLI would show that host's answer as the console's.

Found by trying it: a console (or something in front of it) answering 302 to another host had requests drop
the token and follow, and `e31 ls` printed the other host's jobs list as if the console had sent it. A
redirect within the console's own address (a path, or http:// upgraded to https:// on the same host) is
still followed; any other ends the command with one line naming where it pointed.
"""

import http.server
import json
import threading
from contextlib import contextmanager

import pytest

from e31cli import client, config, main

JOBS = {"items": [{"id": 7, "name": "from-elsewhere"}], "count": 1}


@contextmanager
def serving(answer):
    """A real HTTP server on 127.0.0.1 whose every GET is ``answer(handler)``; yields its port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            answer(self)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _jobs(handler):
    body = json.dumps(JOBS).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _moved_to(location):
    def answer(handler):
        handler.send_response(302)
        handler.send_header("Location", location(handler.path))
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


def test_a_redirect_to_another_host_is_refused_not_shown_as_the_consoles_answer():
    with (
        serving(_jobs) as elsewhere,
        serving(_moved_to(lambda path: f"http://localhost:{elsewhere}{path}")) as port,
    ):
        api = client.Api(config.Login(url=f"http://127.0.0.1:{port}", token="e31_x"))
        with pytest.raises(client.ApiError) as refused:
            api.get("/jobs", limit=1)
    assert refused.value.status == 302 and not refused.value.from_console
    assert f"http://localhost:{elsewhere}/api/v1/jobs" in refused.value.detail
    assert main._exit_for(refused.value) == main.EXIT_API


def test_a_redirect_within_the_consoles_own_address_is_followed():
    def answer(handler):
        if handler.path.startswith("/old/"):
            _moved_to(lambda path: path.replace("/old", "", 1))(handler)
        else:
            _jobs(handler)

    with serving(answer) as port:
        api = client.Api(config.Login(url=f"http://127.0.0.1:{port}/old", token="e31_x"))
        assert api.get("/jobs", limit=1) == JOBS
