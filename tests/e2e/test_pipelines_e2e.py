"""Pipelines and arrays on real agents: jobs that run after others, and many tasks from one declaration."""

import pytest
from django.conf import settings
from django.utils import timezone

from jobs import declaration, services
from jobs.models import Job
from metering.models import MeterEntry
from tests.e2e.conftest import wait_for, wait_for_state
from tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture
def member(live_pool):
    return MembershipFactory(
        team=TeamFactory(name="vision", slug="vision"), user=UserFactory(username="alice")
    ).user


def submit(member, name: str, code: str, **extra) -> Job:
    team = member.memberships.first().team
    raw = {
        "name": name, "work": {"argv": ["/usr/bin/python3", "-c", code]},
        "request": {"gpus": 1, "hours": 0.5},
        "output": {"uri": f"file://{settings.E31_OUTPUT_ROOTS[0]}/{team.slug}/{name}", "bytes": 1000},
        **extra,
    }  # fmt: skip
    spec = declaration.validate(raw, limits=services.pool_limits(team=team))
    return services.submit_job(team=team, user=member, spec=spec, now=timezone.now())


def test_a_pipeline_runs_in_order_and_a_failed_step_ends_what_needed_it_unmetered(live_pool, member):
    slow = "import time; time.sleep(4); print('preprocessed')"
    preprocess = submit(member, "preprocess", slow)
    train = submit(member, "train", "print('trained')", after_ok=[preprocess.id])
    broken = submit(member, "broken", "import sys; sys.exit(2)")
    needs_broken = submit(member, "needs-broken", "print('never')", after_ok=[broken.id])
    then_report = submit(member, "report", "print('reported')", after_any=[broken.id])

    waiting = wait_for(
        lambda: Job.objects.filter(id=train.id, state="queued", pending_reason__startswith="waiting").first(),
        timeout=60, what="train to wait in the queue with a reason",
    )  # fmt: skip
    assert waiting.pending_reason.startswith(f"waiting for job {preprocess.id} to succeed")

    train = wait_for_state(train.id, "released", timeout=90)
    preprocess.refresh_from_db()
    assert train.end_reason == "succeeded"
    assert train.allocations.get().rented_at >= preprocess.allocations.get().released_at

    needs_broken = wait_for_state(needs_broken.id, "ended", timeout=90)
    assert needs_broken.end_reason == "dependency_failed"
    assert needs_broken.end_detail == f"job {broken.id} ended failed; this job ran only after it succeeded"
    assert not needs_broken.allocations.exists()
    assert not MeterEntry.objects.filter(allocation__job=needs_broken).exists()
    assert wait_for_state(then_report.id, "released", timeout=90).end_reason == "succeeded"
