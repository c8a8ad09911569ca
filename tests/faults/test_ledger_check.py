"""The ledger check run after every fault test: a violation fails it as an assertion, never as check_ledger's
exit, a SystemExit that pytest would let out of the teardown it runs in, skipping the database's flush and every
other teardown left, so that each later test would fail on this one's rows."""

from datetime import timedelta

import pytest

from tests.factories import NodeFactory
from tests.faults.conftest import assert_ledger_sound
from tests.metering.conftest import T0, release, rent

pytestmark = pytest.mark.django_db


def test_a_sound_ledger_passes_the_check(team):
    node = NodeFactory(name="gpu-checked", gpus=4)
    release(rent(team=team, node=node, at=T0, gpu_indices=[0]), at=T0 + timedelta(hours=2))
    assert_ledger_sound()


def test_a_violation_fails_the_check_as_an_assertion_that_lists_it(team):
    node = NodeFactory(name="gpu-checked", gpus=4)
    for name in ("first", "second"):  # one GPU metered twice
        release(rent(team=team, node=node, at=T0, name=name, gpu_indices=[0]), at=T0 + timedelta(hours=2))
    with pytest.raises(AssertionError, match=r"GPU 0 of gpu-checked .* one GPU metered twice"):
        assert_ledger_sound()
