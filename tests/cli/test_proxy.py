"""The token never goes through a proxy to a console on this machine: plain http:// is allowed there only because
it never leaves the machine, and an HTTP_PROXY from the environment would carry it, readable, to another. A
console elsewhere (https://) is still reached through the environment's proxy."""

import pytest

from e31cli import client, config

PROXY = "http://192.0.2.2:3128"


@pytest.mark.parametrize(
    "console, proxies",
    [
        ("http://127.0.0.1:8000", {}),
        ("http://localhost:8000", {}),
        ("https://console.example", {"http": PROXY, "https": PROXY}),
    ],
)
def test_only_a_console_elsewhere_is_reached_through_the_environments_proxy(monkeypatch, console, proxies):
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.setenv(name, PROXY)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    api = client.Api(config.Login(url=console, token="e31_x"))
    settings = api.session.merge_environment_settings(f"{console}/api/v1/jobs", {}, None, None, None)
    assert {k: v for k, v in settings["proxies"].items() if k in ("http", "https")} == proxies


def test_a_loopback_https_console_keeps_the_ca_the_environment_names(monkeypatch, tmp_path):
    """A console on this machine with a private certificate (mkcert): REQUESTS_CA_BUNDLE is how the CLI trusts it."""
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    api = client.Api(config.Login(url="https://localhost:8443", token="e31_x"))
    settings = api.session.merge_environment_settings(
        "https://localhost:8443/api/v1/jobs", {}, None, None, None
    )
    assert settings["verify"] == str(bundle)
