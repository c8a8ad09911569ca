"""Fixtures for staging and delivery: fresh roots, a local HTTP server, jobs with inputs."""

import hashlib
from pathlib import Path
from types import SimpleNamespace

import celery
import pytest
from django.utils import timezone

from jobs import cache_fill, dispatch
from jobs.models import DataInput, Job
from tests.factories import JobFactory
from tests.staging.httpserver import DataServer


@pytest.fixture
def roots(settings, tmp_path):
    """Data, output, staging and agent roots of their own (``datasets``/``outputs``: the team's folder); quick retries."""
    paths = SimpleNamespace(
        **{n: (tmp_path / n) for n in ("datasets", "outputs", "staging", "agents", "outside")}
    )
    for path in vars(paths).values():
        path.mkdir()
    settings.E31_DATA_ROOTS = [paths.datasets.resolve()]
    settings.E31_OUTPUT_ROOTS = [paths.outputs.resolve()]
    # The tests' team ("vision") reads and writes its own folder of each root.
    paths.data_root, paths.output_root = paths.datasets.resolve(), paths.outputs.resolve()
    paths.datasets, paths.outputs = paths.data_root / "vision", paths.output_root / "vision"
    paths.datasets.mkdir()
    paths.outputs.mkdir()
    settings.E31_STAGING_ROOT = paths.staging.resolve()
    settings.E31_AGENT_ROOT = paths.agents.resolve()
    settings.E31_TRANSFER_RETRIES = 3
    settings.E31_TRANSFER_BACKOFF_S = 0.01
    settings.E31_ALLOW_PRIVATE_SOURCES = False
    settings.E31_ALLOW_HARDLINKED_SOURCES = False
    return paths


@pytest.fixture
def server(tmp_path):
    data = DataServer(tmp_path / "served").start()
    yield data
    data.stop()


@pytest.fixture
def private_ok(settings):
    """The local server is on 127.0.0.1: tests that use it allow private sources, as an operator may."""
    settings.E31_ALLOW_PRIVATE_SOURCES = True


@pytest.fixture
def sent(monkeypatch):
    """The stagers' retries, as they would be sent once their commits are done; a wait in a stager's thread fails
    the test."""
    messages = []
    monkeypatch.setattr(celery.current_app, "send_task", lambda name, **kw: messages.append((name, kw)))
    monkeypatch.setattr(dispatch, "after_commit", lambda send, what: send())

    def no_wait_in_the_thread(watch, detail):
        raise AssertionError(f"the stager waited in its thread: {detail}")

    monkeypatch.setattr(cache_fill.FillWatch, "wait", no_wait_in_the_thread)
    return messages


def write(path: Path, content: bytes) -> tuple[Path, str]:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path, hashlib.sha256(content).hexdigest()


def make_job(team, *inputs: dict, state: str = "submitted", name: str = "stage-me") -> Job:
    """A job with declared inputs: each a dict of name, uri, bytes and optional sha256."""
    job = JobFactory(team=team, name=name, state=state, submitted_at=timezone.now())
    for position, spec in enumerate(inputs):
        DataInput.objects.create(job=job, position=position, sha256=spec.get("sha256", ""),
                                 **{k: spec[k] for k in ("name", "uri", "bytes")})  # fmt: skip
    return job


def file_uri(path: Path) -> str:
    return f"file://{path}"
