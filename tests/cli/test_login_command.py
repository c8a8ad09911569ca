"""`e31 login URL` takes the console's address as a browser shows it, and refuses locally what it cannot use: an
address without its scheme, an empty token. Nothing is sent and nothing stored then."""

import io
import json
import sys

import pytest

from e31cli import config, main
from tests.cli.test_exit_codes import answered_by_adapter, exit_of

NO_JOBS = {"items": [], "count": 0}


@pytest.fixture
def config_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    for name in ("E31_URL", "E31_TOKEN", "E31_ALLOW_PLAIN_HTTP"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.mark.parametrize(
    "url", ["127.0.0.1:8000", "localhost:8000", "console.example.com", "ftp://console.example"]
)
def test_an_address_without_http_or_https_is_a_usage_error_saying_to_add_it(
    monkeypatch, capsys, config_home, url
):
    """`e31 login 127.0.0.1:8000` said "Cannot reach the console: No connection adapters were found" (exit 7)."""
    sent = answered_by_adapter(monkeypatch, 200, NO_JOBS)
    code, stderr = exit_of(monkeypatch, capsys, "login", url, "--token", "e31_x")
    assert (code, sent) == (main.EXIT_USAGE, []), stderr
    said = " ".join(stderr.split())
    assert "https://" in said and "http://" in said and "Cannot reach" not in said, said
    assert not config.login_file().exists()


@pytest.mark.parametrize("url", ["https://console.example:abc", "http://127.0.0.1:99999"])
def test_an_address_whose_port_is_no_port_is_a_usage_error(monkeypatch, capsys, config_home, url):
    """`e31 login https://host:abc` said "Cannot reach the console" (exit 7)."""
    sent = answered_by_adapter(monkeypatch, 200, NO_JOBS)
    code, stderr = exit_of(monkeypatch, capsys, "login", url, "--token", "e31_x")
    assert (code, sent) == (main.EXIT_USAGE, []), stderr
    assert "Cannot reach" not in stderr and "port" in stderr.lower(), stderr


@pytest.mark.parametrize("suffix", ["/api/v1", "/api/v1/"])
def test_the_apis_own_address_is_taken_for_the_consoles(monkeypatch, capsys, config_home, suffix):
    """Copied from the API docs, `http://host:8000/api/v1` was stored as it was, and every command asked
    /api/v1/api/v1/jobs: 404."""
    sent = answered_by_adapter(monkeypatch, 200, NO_JOBS)
    code, stderr = exit_of(monkeypatch, capsys, "login", f"http://127.0.0.1:8000{suffix}", "--token", "e31_x")
    assert code == 0, stderr
    assert [r.url for r in sent] == ["http://127.0.0.1:8000/api/v1/jobs?limit=1"]
    assert json.loads(config.login_file().read_text())["url"] == "http://127.0.0.1:8000"


def test_a_console_served_under_a_prefix_keeps_it(monkeypatch, capsys, config_home):
    sent = answered_by_adapter(monkeypatch, 200, NO_JOBS)
    code, stderr = exit_of(monkeypatch, capsys, "login", "https://tools.example/e31/", "--token", "e31_x")
    assert code == 0, stderr
    assert [r.url for r in sent] == ["https://tools.example/e31/api/v1/jobs?limit=1"]


@pytest.mark.parametrize("stdin", ["", "\n", "   \n"], ids=["empty", "a blank line", "spaces"])
def test_an_empty_token_from_stdin_is_refused_before_anything_is_sent(
    monkeypatch, capsys, config_home, stdin
):
    """`e31 login URL < /dev/null` sent an empty token: "Error 401: The Bearer token is empty"."""
    sent = answered_by_adapter(monkeypatch, 200, NO_JOBS)
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code, stderr = exit_of(monkeypatch, capsys, "login", "https://console.example")
    assert (code, sent) == (main.EXIT_USAGE, []), stderr
    assert "no API token" in " ".join(stderr.split()), stderr
    assert not config.login_file().exists()


def test_a_blank_token_option_is_refused_too(monkeypatch, capsys, config_home):
    sent = answered_by_adapter(monkeypatch, 200, NO_JOBS)
    code, stderr = exit_of(monkeypatch, capsys, "login", "https://console.example", "--token", "  ")
    assert (code, sent) == (main.EXIT_USAGE, []), stderr
