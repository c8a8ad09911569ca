"""What `e31` (main.run, the installed entry point) says and exits with when the console's answer or the
command line is wrong: one line and a documented exit code, never a traceback."""

import io
import sys

import pytest
import requests

from e31cli import main
from tests.cli.inprocess import e31


def run_e31(monkeypatch, capsys, answer, *args: str) -> tuple[int, str]:
    """(exit code, stderr) of ``e31 ARGS`` whose every request is answered by ``answer``."""
    monkeypatch.setenv("E31_URL", "http://console.test")
    monkeypatch.setenv("E31_TOKEN", "e31_x")
    monkeypatch.setattr(requests.Session, "request", lambda self, method, url, **kw: answer(url))
    monkeypatch.setattr(sys, "argv", ["e31", *args])
    with pytest.raises(SystemExit) as exit_:
        main.run()
    return exit_.value.code, capsys.readouterr().err


def test_a_read_timeout_exits_as_an_unreachable_console_with_one_line(monkeypatch, capsys):
    def slow(url):
        raise requests.ReadTimeout("Read timed out. (read timeout=30)")

    code, stderr = run_e31(monkeypatch, capsys, slow, "show", "1")
    assert code == main.EXIT_UNREACHABLE
    assert stderr == "The console did not answer in time: Read timed out. (read timeout=30)\n"


def test_a_success_whose_body_is_not_json_is_an_api_error_with_one_line(monkeypatch, capsys):
    def proxy_page(url):  # a proxy's or load balancer's page, answered 200 in front of the console
        response = requests.Response()
        response.status_code, response.url = 200, url
        response.headers["Content-Type"] = "text/html"
        response.raw = io.BytesIO(b"<html><body>Please log in</body></html>")
        return response

    code, stderr = run_e31(monkeypatch, capsys, proxy_page, "show", "1")
    assert code == main.EXIT_API
    assert stderr == "Error 200: the console's answer is not JSON (text/html)\n"


def test_a_console_still_throttling_after_the_retries_exits_as_unreachable_not_as_a_failed_job(
    monkeypatch, capsys
):
    def throttled(url):
        response = requests.Response()
        response.status_code, response.url = 429, url
        response.headers.update({"Content-Type": "application/json", "Retry-After": "1"})
        response.raw = io.BytesIO(b'{"detail": "Too many requests."}')
        return response

    code, stderr = run_e31(monkeypatch, capsys, throttled, "show", "1")
    assert code == main.EXIT_UNREACHABLE
    assert stderr == "Error 429: Too many requests.\n"


def test_a_malformed_ledger_month_is_a_command_line_error(monkeypatch):
    code, stdout, stderr = e31(monkeypatch, "e31_x", "ledger", "--month", "2024-13")
    assert code == 2, (code, stdout, stderr)
    assert "'2024-13': use YYYY-MM" in stderr
