"""Fixtures of the job runtime's tests."""

import pytest

from jobs import syscalls
from tests.jobs.sandboxed import allow_all


@pytest.fixture
def filter_lets_everything_through(monkeypatch):
    """For a test of a layer under the syscall filter: jobs get a filter that refuses nothing."""
    program = allow_all()
    monkeypatch.setattr(syscalls, "compiled", lambda: program)
