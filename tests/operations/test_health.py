"""The health page: broker, database, agents, beat, the reconciler's findings, the ledger check."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from e31web.celery import app
from jobs.lifecycle import State
from jobs.models import Allocation, Dependency, Job, Node
from operations import health, services
from operations.models import AuditEntry
from tests.factories import JobFactory, NodeFactory
from tests.operations.conftest import HTMX

pytestmark = pytest.mark.django_db
HEALTH = reverse("operations:health")


def checks(now) -> dict[str, health.Check]:
    return {c.key: c for c in health.run_all(now=now)}


def test_a_healthy_console_is_all_green(operator_client, pool, now):
    services.beat_heartbeat(now=now)
    services.check_ledger(now=now)
    found = checks(timezone.now())
    assert {k: c.ok for k, c in found.items()} == dict.fromkeys(
        ("broker", "database", "agents", "beat", "reconciler", "ledger"), True
    )
    assert "2 of 2 live nodes" in found["agents"].summary
    page = operator_client.get(HEALTH).content.decode()
    assert "all green" in page and page.count(">green</span>") == 6


def test_an_unreachable_broker_is_red_with_the_reason(monkeypatch):
    # Celery reads CELERY_BROKER_URL from the environment before its own settings.
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setitem(app.conf, "broker_url", "redis://127.0.0.1:1/0")
    check = health.broker()
    assert not check.ok and "unreachable" in check.summary


def test_silent_agents_are_red_and_named(pool, now):
    NodeFactory(name="gpu-quiet", last_heartbeat=now - timedelta(minutes=3))
    check = checks(now)["agents"]
    assert not check.ok and "2 of 3 live nodes" in check.summary and check.detail == ["silent: gpu-quiet"]


def test_a_node_the_platform_declared_lost_keeps_the_check_red_until_it_returns_or_is_retired(pool, now):
    """An operator walk: local-1's agent froze, the reconciler declared it down, and Health read green, "1 of 1
    live nodes beat within 30 s": the lost node had left the count. One an operator marked down, or retired, is
    no alarm."""
    lost = NodeFactory(name="gpu-lost", state=Node.NodeState.DOWN, last_heartbeat=now - timedelta(minutes=3))
    NodeFactory(name="gpu-held", state=Node.NodeState.DOWN, held_down_by="olga", last_heartbeat=now)
    NodeFactory(
        name="gpu-gone", state=Node.NodeState.DOWN, retired_at=now, last_heartbeat=now - timedelta(days=1)
    )
    check = checks(now)["agents"]
    assert not check.ok and "1 lost" in check.summary, check.summary
    assert [line for line in check.detail if "gpu-" in line and "lost" in line] == ["lost: gpu-lost"], (
        check.detail
    )
    lost.state, lost.last_heartbeat = Node.NodeState.UP, now
    lost.save()
    assert checks(now)["agents"].ok


def test_health_does_not_say_no_agent_registered_when_every_node_is_down(now):
    """Both nodes of the pool went silent and were declared down (a power cut). The health page's agents
    check says "no agent has registered", which sends the operator looking for a setup problem instead
    of two dead machines; it should name the nodes that are down."""
    NodeFactory(name="gpu-01", state=Node.NodeState.DOWN, last_heartbeat=now - timedelta(hours=1))
    NodeFactory(name="gpu-02", state=Node.NodeState.DOWN, last_heartbeat=now - timedelta(hours=1))
    check = health.agents(now=now)
    assert not check.ok
    assert "no agent has registered" not in check.summary
    assert any("gpu-01" in line for line in [check.summary, *check.detail])


def test_beat_is_red_until_it_beats_and_again_when_it_falls_silent(now):
    assert not checks(now)["beat"].ok
    services.beat_heartbeat(now=now - timedelta(seconds=10))
    assert checks(now)["beat"].ok
    assert not checks(now + timedelta(minutes=5))["beat"].ok


def test_the_reconcilers_findings_are_shown_without_redriving_anything(
    django_capture_on_commit_callbacks, team, pool, now
):
    stale = now - timedelta(minutes=10)
    stuck = JobFactory(team=team, state=State.SUBMITTED, submitted_at=stale, state_changed_at=stale)
    silent = JobFactory(team=team, state=State.RUNNING, state_changed_at=stale, worker_seen_at=stale)
    with django_capture_on_commit_callbacks() as enqueued:
        check = checks(now)["reconciler"]
    assert not check.ok
    assert f"#{stuck.id}" in check.detail[0] and f"#{silent.id}" in check.detail[1]
    assert enqueued == []
    assert Job.objects.get(id=silent.id).state == State.RUNNING and not Allocation.objects.exists()


def test_the_ledger_check_reports_violations_in_red(team, pool, now):
    job = JobFactory(team=team, state=State.RELEASED, end_reason="succeeded")
    # Released, but never metered: no ledger row tiles its RENT..RELEASE.
    Allocation.objects.create(
        job=job, attempt=1, node=pool[0], gpu_indices=[0],
        rented_at=now - timedelta(hours=1), released_at=now - timedelta(minutes=1),
    )  # fmt: skip
    services.check_ledger(now=now)
    check = checks(now)["ledger"]
    assert not check.ok and "invariants broken" in check.summary
    assert any("allocation" in line and f"job {job.id}" in line for line in check.detail)


def test_on_a_fresh_start_a_ledger_check_not_run_yet_is_pending_not_red(operator_client, pool, now):
    services.beat_heartbeat(now=now - timedelta(seconds=20))  # beat has just started
    services.beat_heartbeat(now=now)
    check = checks(now)["ledger"]
    assert check.pending and "not run yet" in check.summary
    page = operator_client.get(HEALTH).content.decode()
    assert ">red</span>" not in page and "attention" not in page
    assert '<span class="badge muted">pending</span>' in page and "1 check not run yet" in page


def test_a_ledger_check_not_run_long_after_beat_started_or_run_long_ago_is_red(now):
    limit = timedelta(seconds=2 * health.beat_period_s(health.LEDGER_ENTRY, 600.0) + 60)
    for beat in range(0, int(limit.total_seconds()) + 30, 10):  # beat kept beating all along
        services.beat_heartbeat(now=now - limit - timedelta(seconds=30) + timedelta(seconds=beat))
    check = checks(now)["ledger"]
    assert not check.ok and not check.pending and "not run since beat started" in check.summary
    services.check_ledger(now=now - timedelta(days=1))
    assert "stale" in checks(now)["ledger"].summary and not checks(now)["ledger"].ok


def test_beat_back_after_a_silence_counts_as_a_fresh_start(now):
    services.beat_heartbeat(now=now - timedelta(days=1))
    services.beat_heartbeat(now=now)
    assert checks(now)["ledger"].pending


def test_check_now_runs_the_ledger_check_and_records_who_asked(operator_client):
    response = operator_client.post(reverse("operations:ledger-check"))
    assert response.status_code == 302
    entry = AuditEntry.objects.get(action="health.ledger-check")
    assert entry.actor == "olga" and entry.after == {"ok": True, "violations": 0}


def test_the_health_checks_are_a_self_polling_fragment(operator_client):
    fragment = operator_client.get(HEALTH, **HTMX).content.decode()
    assert fragment.lstrip().startswith('<section id="health-checks"') and 'hx-trigger="every 5s"' in fragment


def test_the_reconcilers_findings_list_only_what_the_reconciler_would_act_on(team, pool, now):
    """A job waiting for its prerequisite, or a spanning job waiting for its other part's start, is not stuck:
    the page showed them red ("stuck before staging", "agent stopped reporting") while nothing was wrong."""
    stale = now - timedelta(minutes=10)
    first = JobFactory(team=team, state=State.RUNNING, state_changed_at=now, worker_seen_at=now)
    waiting = JobFactory(team=team, state=State.SUBMITTED, submitted_at=stale, state_changed_at=stale)
    Dependency.objects.create(job=waiting, prerequisite=first, kind=Dependency.AFTER_OK)
    spanning = JobFactory(
        team=team, state=State.RUNNING, state_changed_at=stale, worker_seen_at=stale, attempt=1
    )
    a, b = pool[0], pool[1]
    Allocation.objects.create(job=spanning, attempt=1, node=a, rank=0, gpu_indices=[0], rented_at=stale,
                              started_at=stale)  # fmt: skip
    Allocation.objects.create(job=spanning, attempt=1, node=b, rank=1, gpu_indices=[0], rented_at=now)
    assert checks(now)["reconciler"].ok, checks(now)["reconciler"].detail
