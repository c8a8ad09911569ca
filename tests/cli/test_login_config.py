"""The stored login's token goes only to the console it was stored for."""

import pytest

from e31cli import config


@pytest.fixture
def stored(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("E31_URL", raising=False)
    monkeypatch.delenv("E31_TOKEN", raising=False)
    config.save(config.Login(url="https://console.example:8443", token="e31_stored"))


def test_the_stored_token_goes_to_its_own_console(stored, monkeypatch):
    assert config.current() == config.Login(url="https://console.example:8443", token="e31_stored")
    monkeypatch.setenv("E31_URL", "https://console.example:8443/")  # the same console, written another way
    assert config.current().token == "e31_stored"


@pytest.mark.parametrize(
    "url",
    [
        "https://elsewhere.example",
        "https://console.example",
        "http://console.example:8443",
        "https://console.example:8443/another-console",  # a console served under a prefix of the same host
    ],
)
def test_e31_url_naming_another_console_does_not_get_the_stored_token(stored, monkeypatch, url):
    """$E31_URL and the stored token were taken independently: any script or Makefile that set E31_URL to
    another host sent it the user's token."""
    monkeypatch.setenv("E31_URL", url)
    with pytest.raises(
        config.NotLoggedIn, match=r"stored login is for https://console\.example:8443"
    ) as refused:
        config.current()
    assert "e31_stored" not in str(refused.value)
    monkeypatch.setenv("E31_TOKEN", "e31_other")
    assert config.current() == config.Login(url=url, token="e31_other")


def test_a_damaged_login_file_is_named_not_a_traceback(stored):
    config.login_file().write_text("{not json")
    with pytest.raises(config.NotLoggedIn, match=r"cannot be read.*e31 login"):
        config.current()
