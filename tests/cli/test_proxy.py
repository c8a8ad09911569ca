"""The token never goes through a proxy to a console on this machine: plain http:// is allowed there only because
it never leaves the machine, and an HTTP_PROXY from the environment would carry it, readable, to another."""

import requests

from e31cli import client, config


def test_a_loopback_console_is_reached_without_the_environments_proxy(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://192.0.2.2:3128")
    monkeypatch.setenv("http_proxy", "http://192.0.2.2:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    api = client.Api(config.Login(url="http://127.0.0.1:8000", token="e31_x"))
    settings = api.session.merge_environment_settings(
        "http://127.0.0.1:8000/api/v1/jobs", {}, None, None, None
    )
    assert settings["proxies"] == {}


def test_a_remote_console_still_goes_through_the_environments_proxy(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://192.0.2.2:3128")
    monkeypatch.setenv("https_proxy", "http://192.0.2.2:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    api = client.Api(config.Login(url="https://console.example", token="e31_x"))
    settings = api.session.merge_environment_settings(
        "https://console.example/api/v1/jobs", {}, None, None, None
    )
    assert settings["proxies"].get("https") == "http://192.0.2.2:3128"
    assert isinstance(api.session, requests.Session)
