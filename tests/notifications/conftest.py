import ipaddress

import pytest

from tests.notifications.receiver import Receiver


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.stop()


@pytest.fixture
def loopback_allowed(settings):
    """The receiver listens on 127.0.0.1: these tests allow loopback, as an operator may allow a network."""
    settings.E31_WEBHOOK_PRIVATE_NETWORKS = [ipaddress.ip_network("127.0.0.1/32")]
