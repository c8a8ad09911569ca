"""Without Chromium the browser tests skip, with the reason, unless CI requires the browser."""

import pytest

from tests.browser.conftest import _chromium


def test_a_missing_chromium_fails_the_run_when_the_browser_is_required(monkeypatch):
    monkeypatch.setenv("E31_CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("E31_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="E31_REQUIRE_BROWSER=1 but Chromium is not installed"):
        _chromium()


def test_a_missing_chromium_skips_with_its_reason_otherwise(monkeypatch):
    monkeypatch.setenv("E31_CHROMIUM", "/nonexistent/chromium")
    monkeypatch.delenv("E31_REQUIRE_BROWSER", raising=False)
    with pytest.raises(pytest.skip.Exception, match="Chromium is not installed at /nonexistent/chromium"):
        _chromium()
