"""A test needing what the machine lacks skips with what is missing, unless CI requires everything."""

import pytest

from tests import machine


def test_what_is_missing_is_named_and_what_is_there_is_not(tmp_path):
    assert machine.lacking(paths=[tmp_path, tmp_path / "traces.swf.gz"]) == str(tmp_path / "traces.swf.gz")
    assert machine.lacking(paths=[tmp_path]) == ""


def test_a_missing_requirement_fails_the_run_when_everything_is_required(monkeypatch):
    monkeypatch.setenv("E31_REQUIRE_ALL", "1")
    with pytest.raises(pytest.fail.Exception, match="E31_REQUIRE_ALL=1 but this machine lacks root"):
        machine.missing("root")


def test_a_missing_requirement_skips_with_its_reason_otherwise(monkeypatch):
    monkeypatch.delenv("E31_REQUIRE_ALL", raising=False)
    with pytest.raises(pytest.skip.Exception, match="this machine lacks root"):
        machine.missing("root")
