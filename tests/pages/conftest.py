"""Fixtures for the public pages: a clean rate-limit cache, intake switches, an application."""

import importlib

import pytest
from django.apps import apps
from django.core.cache import cache
from django.utils import timezone

from public import services
from tests.pages.factories import ApplicationFactory


@pytest.fixture(autouse=True)
def _fresh_rate_limits(db):
    """Rate-limit counters live in the cache: the database's table (rolled back with the test) or Redis (not)."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture(autouse=True)
def _seeded_problems(db):
    """The four problems the data migration publishes.

    A transactional test elsewhere in the suite flushes every table, the migration's rows with
    them; putting them back (the seed skips what exists) keeps these tests independent of order.
    """
    importlib.import_module("e31web.migrations.0003_seed_problems").seed(apps, None, app_label="public")


@pytest.fixture
def intake_open(db, operator):
    services.set_intake_open(is_open=True, by=operator.username, now=timezone.now())


@pytest.fixture
def application(db):
    return ApplicationFactory()
