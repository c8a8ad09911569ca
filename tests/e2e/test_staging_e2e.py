"""Staging for real: a job reads its file:// input in the sandbox; a second job on the same data moves 0 bytes."""

import hashlib
import os

import pytest
from django.utils import timezone

from jobs import declaration, services
from jobs.models import DatasetCacheEntry
from tests.e2e.conftest import wait_for_state
from tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

READ = (
    "import hashlib, os; data = open(os.environ['E31_DATA_DIR'] + '/corpus', 'rb').read(); "
    "print('read', len(data), hashlib.sha256(data).hexdigest())"
)


@pytest.fixture
def member(live_pool):
    return MembershipFactory(
        team=TeamFactory(name="nlp", slug="nlp"), user=UserFactory(username="nadia")
    ).user


def submit(member, *, name: str, data: list[dict]):
    from django.conf import settings

    team = member.memberships.first().team
    spec = declaration.validate(
        {
            "name": name, "work": {"argv": ["/usr/bin/python3", "-c", READ]}, "data": data,
            "request": {"gpus": 1, "hours": 1.0},
            "output": {"uri": f"file://{settings.E31_OUTPUT_ROOTS[0]}/{team.slug}/{name}", "bytes": 1000},
        },
        limits=services.pool_limits(team=team),
    )  # fmt: skip
    return services.submit_job(team=team, user=member, spec=spec, now=timezone.now())


def test_a_job_reads_its_staged_input_and_a_second_job_on_the_same_dataset_moves_nothing(
    live_pool, member, settings
):
    content = os.urandom(3 * 1024 * 1024)
    path = settings.E31_DATA_ROOTS[0] / "nlp" / "corpus.bin"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(content)
    digest = hashlib.sha256(content).hexdigest()
    data = [{"name": "corpus", "uri": f"file://{path}", "bytes": len(content), "sha256": digest}]

    first = wait_for_state(submit(member, name="first", data=data).id, "released")
    assert first.end_reason == "succeeded", first.log_tail
    assert f"read {len(content)} {digest}" in first.log_tail  # read inside the sandbox, from $E31_DATA_DIR
    staged = first.inputs.get()
    assert (staged.stage_state, staged.bytes_done) == ("staged", len(content))

    second = wait_for_state(submit(member, name="second", data=data).id, "released")
    assert second.end_reason == "succeeded", second.log_tail
    assert f"read {len(content)} {digest}" in second.log_tail
    cached = second.inputs.get()
    assert cached.stage_state == "cached" and "0 bytes moved" in cached.stage_detail
    assert DatasetCacheEntry.objects.get().hits == 1
