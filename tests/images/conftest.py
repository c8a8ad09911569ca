"""The image tests' registry and base image, both made once per session.

The registry starts as PostgreSQL does for the suite; the base image is built with umoci from
busybox-static (2 MB), so every registry test stays well under a second of image work.
"""

import shutil

import pytest

from tests.images.registry import build_image, push, start, stop


@pytest.fixture(scope="session")
def registry(tmp_path_factory):
    if not shutil.which("docker-registry") or not shutil.which("skopeo") or not shutil.which("umoci"):
        pytest.fail("image tests need docker-registry, skopeo and umoci (bin/ensure-services installs them)")
    running = start(tmp_path_factory.mktemp("registry"))
    yield running
    stop(running)


@pytest.fixture(scope="session")
def base_image(registry, tmp_path_factory) -> str:
    """tests/busybox:1 in the registry, built once per session: its reference."""
    layout = tmp_path_factory.mktemp("images") / "base"
    build_image(layout)
    push(layout, registry, "tests/busybox:1")
    return f"{registry.host}/tests/busybox:1"


@pytest.fixture
def pool_registry(settings, registry):
    """The tests' registry is the pool's own: private address, plain HTTP."""
    settings.E31_POOL_REGISTRIES = [registry.host]
    return registry
