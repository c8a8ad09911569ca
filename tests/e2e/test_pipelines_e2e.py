"""Pipelines and arrays on real agents: jobs that run after others, and many tasks from one declaration."""

import json

import pytest
from django.conf import settings
from django.utils import timezone

from jobs import declaration, services
from jobs.models import Job
from metering.models import MeterEntry
from tests.e2e.conftest import wait_for, wait_for_state
from tests.e2e.test_cli_e2e import console, e31, job_file  # noqa: F401 (console is a fixture)
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

    waiting = wait_for(  # unstaged until then: its inputs may be what preprocess writes
        lambda: Job.objects.filter(id=train.id, state="submitted", pending_reason__startswith="waiting").first(),
        timeout=60, what="train to wait, unstaged, with a reason",
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


def _overlap(intervals) -> int:
    """The most intervals open at one instant."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_an_array_from_the_terminal_runs_each_index_at_most_n_at_once_and_cancels_as_one(console, tmp_path):  # noqa: F811
    base, token, env, outputs = console
    env = {**env, "E31_URL": base, "E31_TOKEN": token}
    code = (
        "import os, time; i = os.environ['E31_ARRAY_INDEX']; print('task', i); time.sleep(1.5); "
        "open(os.environ['E31_OUTPUT_DIR'] + '/index.txt', 'w').write(i)"
    )
    path = job_file(tmp_path / "sweep.toml", outputs, "sweep", code)
    path.write_text('array = "0-5%2"\n' + path.read_text())
    run = e31(env, "submit", str(path))
    assert run.returncode == 0, run.stderr
    first_array = int(run.stdout)  # an array's submit prints the array's id
    tasks = wait_for(
        lambda: (ts := list(Job.objects.filter(array_id=first_array))) and all(t.state == "released" for t in ts) and ts,
        timeout=180, what="every task of the array to end",
    )  # fmt: skip
    assert sorted(t.array_index for t in tasks) == [0, 1, 2, 3, 4, 5]
    assert {t.end_reason for t in tasks} == {"succeeded"}
    for t in tasks:
        assert f"task {t.array_index}" in t.log_tail
    held = [(a.rented_at, a.released_at) for t in tasks for a in t.allocations.all()]
    assert len(held) == 6 and _overlap(held) <= 2
    listed = e31(env, "ls", "--array", str(first_array), "--json")
    assert sorted(json.loads(line)["array"]["index"] for line in listed.stdout.splitlines()) == [
        0,
        1,
        2,
        3,
        4,
        5,
    ]

    slow = job_file(tmp_path / "slow.toml", outputs, "slow", "import time; time.sleep(120)")
    slow.write_text('array = "0-9%1"\n' + slow.read_text())
    second_array = int(e31(env, "submit", str(slow)).stdout)
    # Any one task: the limit lets one run at a time, and which starts first is the scheduler's choice, not the test's.
    wait_for(
        lambda: Job.objects.filter(array_id=second_array, state="running").exists(),
        timeout=90, what="a task of the slow array to run",
    )  # fmt: skip
    cancelled = e31(env, "cancel", "--array", str(second_array))
    assert cancelled.returncode == 0, cancelled.stderr
    ends = wait_for(
        lambda: (ts := list(Job.objects.filter(array_id=second_array))) and all(not t.is_alive for t in ts) and ts,
        timeout=60, what="the cancelled array to end",
    )  # fmt: skip
    assert {t.end_reason for t in ends} == {"cancelled"}
    assert sum(t.allocations.exists() for t in ends) == 1  # only the one running task was ever metered
