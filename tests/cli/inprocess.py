"""Runs the `e31` command in this process against the console's API through Django's test client.

A requests transport adapter hands each request to ``django.test.Client``, so the CLI's own code
(options, headers, exit codes) meets the real API, views and database without a server.
"""

import io
import json

import requests
from django.test import Client
from typer.testing import CliRunner

from e31cli import client, main

BASE = "https://console.test"


class DjangoAdapter(requests.adapters.BaseAdapter):
    def __init__(self) -> None:
        super().__init__()
        self.client = Client()

    def send(self, request, **kwargs):
        path = request.path_url
        headers = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in request.headers.items()}
        headers.pop("HTTP_CONTENT_TYPE", None)
        headers.pop("HTTP_CONTENT_LENGTH", None)
        body = request.body or b""
        answer = self.client.generic(
            request.method, path, body, content_type=request.headers.get("Content-Type", ""), **headers
        )
        response = requests.Response()
        response.status_code = answer.status_code
        response.headers.update(dict(answer.items()))
        content = b"".join(answer.streaming_content) if answer.streaming else answer.content
        response.raw = io.BytesIO(content)
        response.url, response.request = request.url, request
        return response

    def close(self) -> None:
        pass


def use_console(monkeypatch, token: str) -> None:
    """E31_URL/E31_TOKEN set, and every requests session the CLI opens answered by the console in this process."""
    monkeypatch.setenv("E31_URL", BASE)
    monkeypatch.setenv("E31_TOKEN", token)
    original = requests.Session.__init__

    def with_adapter(self, *a, **kw):
        original(self, *a, **kw)
        self.mount(BASE, DjangoAdapter())

    monkeypatch.setattr(requests.Session, "__init__", with_adapter)


def e31(monkeypatch, token: str, *args: str):
    """(exit code, stdout, stderr) of ``e31 ARGS`` with E31_URL/E31_TOKEN set."""
    use_console(monkeypatch, token)
    result = CliRunner().invoke(main.app, list(args))
    code = result.exit_code
    if isinstance(result.exception, client.ApiError):  # what main.run() turns into an exit code
        code = main._exit_for(result.exception)
    return code, result.stdout, result.stderr


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])
