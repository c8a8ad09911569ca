"""Shared fixtures: a team with a member and an admin, a second team, an operator, a pool."""

import threading
import time
from collections import Counter
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.db.backends.postgresql.operations import DatabaseOperations as PostgresOperations
from django.test import Client

from accounts import services as accounts
from common import export, ratelimit
from common.append_only import ALLOW_TRUNCATE
from tests import machine
from tests.factories import MembershipFactory, NodeFactory, TeamFactory, UserFactory

PASSWORD = "correct horse battery"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "needs(lacking): what of the machine a test needs; see tests/machine.py"
    )
    _let_the_flush_truncate()


@pytest.fixture(autouse=True)
def _export_places_freed(monkeypatch):
    """Each test starts with every export place of its process free: a server closes each response it sends, but
    the test client leaves an unread streamed one open, and its place would stay taken for the tests after it."""
    monkeypatch.setattr(export, "_SENDING", threading.BoundedSemaphore(settings.E31_EXPORTS_PER_PROCESS))
    monkeypatch.setattr(export, "_HELD", Counter())  # each team's share of them too


def _let_the_flush_truncate() -> None:
    """Transactional tests are reset by a flush, which on PostgreSQL TRUNCATEs every table, the append-only ones
    too: its transaction alone is let through their TRUNCATE triggers (common.append_only.ALLOW_TRUNCATE)."""
    flush = PostgresOperations.sql_flush

    def sql_flush(self, style, tables, **kwargs) -> list[str]:
        statements = flush(self, style, tables, **kwargs)
        return [ALLOW_TRUNCATE, *statements] if statements else statements

    PostgresOperations.sql_flush = sql_flush


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A test needing what this machine lacks is skipped, or failed under E31_REQUIRE_ALL=1, before its fixtures."""
    for mark in item.iter_markers("needs"):
        if mark.args[0]:
            machine.missing(mark.args[0])


@pytest.fixture
def team(db):
    return TeamFactory(name="vision", slug="vision")


@pytest.fixture
def other_team(db):
    return TeamFactory(name="audio", slug="audio")


@pytest.fixture
def member(team):
    return MembershipFactory(team=team, user=UserFactory(username="alice")).user


@pytest.fixture
def team_admin(team):
    return MembershipFactory(team=team, user=UserFactory(username="adele"), role="admin").user


@pytest.fixture
def outsider(other_team):
    """A member of another team: must never see the first team's objects."""
    return MembershipFactory(team=other_team, user=UserFactory(username="bob")).user


@pytest.fixture
def operator(db):
    return UserFactory(username="olga", is_staff=True)


def _client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def member_client(member) -> Client:
    return _client_for(member)


@pytest.fixture
def outsider_client(outsider) -> Client:
    return _client_for(outsider)


@pytest.fixture
def operator_client(operator) -> Client:
    return _client_for(operator)


@pytest.fixture
def member_token(member) -> str:
    _, token = accounts.create_api_token(user=member, label="tests")
    return token


@pytest.fixture
def pool(db):
    """Two up nodes of 4 GPUs: the pool can place at most 8 GPUs for one job."""
    return [NodeFactory(name="gpu-01"), NodeFactory(name="gpu-02")]


@pytest.fixture
def roots(settings, tmp_path):
    """Fresh data and output roots; returns the first team's (``vision``) folder of each.

    A team's file:// inputs and destinations lie under ``<root>/<team-slug>/``.
    """
    data = tmp_path / "datasets"
    out = tmp_path / "outputs"
    for root in (data, out):
        for slug in ("vision", "audio"):
            (root / slug).mkdir(parents=True)
    settings.E31_DATA_ROOTS = [data.resolve()]
    settings.E31_OUTPUT_ROOTS = [out.resolve()]
    return (data / "vision").resolve(), (out / "vision").resolve()


@pytest.fixture
def still_rate_clock(monkeypatch):
    """The rate limits' clock held still: their windows are aligned to the clock, so a test's requests that
    crossed a window's end (a minute's, an hour's) would count in two windows and pass the limit."""
    held = time.time()
    monkeypatch.setattr(ratelimit, "time", SimpleNamespace(time=lambda: held))
    return held
