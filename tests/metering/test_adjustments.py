"""Corrections (adjustment rows): where they are booked, and the gap credit an operator is offered."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from jobs import rental
from jobs.models import Node
from metering import reports, services
from metering.models import MeterEntry
from operations.models import AuditEntry
from tests.metering.conftest import release, rent

pytestmark = pytest.mark.django_db


def test_a_gap_credit_across_the_year_end_is_booked_in_the_months_it_covers(team, node, operator, settings):
    """A 2-GPU job is rented at 2024-12-31 23:50 UTC; its node goes silent at once and is declared
    down at 2025-01-01 00:10 (a 20-minute timeout), so the meter holds 10 min in December and 10 min in January. The
    operator credits the silent gap (20 min per GPU). Each month is credited the part of the gap
    that lies in it, cut at the hours metered rows are cut at: both months' statements show 0 for
    the job, and the ledger keeps its invariants."""
    rented = datetime(2024, 12, 31, 23, 50, tzinfo=UTC)
    released = datetime(2025, 1, 1, 0, 10, tzinfo=UTC)
    settings.E31_NODE_TIMEOUT_S = 20 * 60
    allocation = rent(team=team, node=node, at=rented, gpus=2, name="new-year")
    Node.objects.filter(id=node.id).update(last_heartbeat=rented)
    node.refresh_from_db()
    rental.lose_node_allocations(node=node, now=released, detail="silent")
    rows = services.adjust_meter(
        allocation_id=allocation.id, microseconds=-20 * 60 * 1_000_000,
        reason="node lost: credit from the last heartbeat to the node declared down",
        author=operator, now=released + timedelta(days=2),
    )  # fmt: skip
    assert [(r.period_start, r.period_end, r.microseconds) for r in rows] == [
        (rented, datetime(2025, 1, 1, tzinfo=UTC), -10 * 60 * 1_000_000),
        (datetime(2025, 1, 1, tzinfo=UTC), released, -10 * 60 * 1_000_000),
    ]
    assert services.find_violations(now=released + timedelta(days=3)) == []
    december = reports.statement(team=team, month=datetime(2024, 12, 1, tzinfo=UTC))
    january = reports.statement(team=team, month=datetime(2025, 1, 1, tzinfo=UTC))
    assert (december.gpu_micros, january.gpu_micros) == (0, 0)


def test_a_credit_of_nearly_all_the_held_time_is_shared_over_its_hours_and_adds_up_exactly(
    team, node, operator
):
    """An operator credits an odd amount, all but a microsecond of the window the meter covers. The credit is
    spread over the hours from RENT to RELEASE in proportion, no hour gets nothing, and the rows add up to the
    amount asked for to the microsecond. (No adjustment reaches past RENT: a credit is at most what was metered,
    a charge at most what the allocation held.)"""
    rented = datetime(2024, 5, 3, 10, 30, tzinfo=UTC)
    allocation = rent(team=team, node=node, at=rented, gpus=1)
    rental.release_job(
        job_id=allocation.job_id, end_reason="succeeded", now=rented + timedelta(hours=2), actor="t"
    )
    rows = services.adjust_meter(
        allocation_id=allocation.id, microseconds=-7_199_999_999, reason="charged twice",
        author=operator, now=rented + timedelta(days=1),
    )  # fmt: skip
    assert [r.period_start.hour for r in rows] == [10, 11, 12]
    assert sum(r.microseconds for r in rows) == -7_199_999_999 and all(r.microseconds < 0 for r in rows)
    assert services.find_violations(now=rented + timedelta(days=1)) == []


def test_the_prefilled_gap_credit_never_exceeds_the_time_the_allocation_held(
    operator_client, team, node, settings
):
    """A node's last heartbeat is at 12:00:00; a job is rented on it at 12:00:40 (the node is still
    within its 90 s timeout) and the node is declared down at 12:01:00, so the job held 2 GPUs for 20 s.
    The operator opens "Credit the gap" and submits it as prefilled: the gap starts no earlier than
    RENT, so the form offers -20 s and the credit is recorded."""
    settings.E31_NODE_TIMEOUT_S = 90
    heartbeat = datetime(2024, 5, 20, 12, 0, tzinfo=UTC)
    allocation = rent(team=team, node=node, at=heartbeat + timedelta(seconds=40), gpus=2)
    Node.objects.filter(id=node.id).update(last_heartbeat=heartbeat)
    node.refresh_from_db()
    rental.lose_node_allocations(node=node, now=heartbeat + timedelta(seconds=60), detail="silent")
    url = reverse("metering:adjust", args=[allocation.id])
    form = operator_client.get(url).content.decode()
    prefilled = re.search(r'name="seconds" id="[^"]*" value="([^"]+)"', form)
    assert prefilled is not None and prefilled.group(1) == "-20.000000"
    response = operator_client.post(
        url, {"seconds": prefilled.group(1), "reason": "node lost: silent gap", "adjusted_seen": "0"}
    )
    assert response.status_code == 302
    assert MeterEntry.objects.get(kind="adjustment").microseconds == -20_000_000


def test_an_adjustment_is_written_to_the_operators_audit_log(team, node, operator):
    """The one operator action that moves billed hours was missing from the audit log (budgets, rights and
    ledger checks were there); the row itself names its author, but nobody reads every row."""
    allocation = rent(team=team, node=node, at=datetime(2024, 5, 1, 10, tzinfo=UTC), gpus=2, name="credited")
    release(allocation, at=datetime(2024, 5, 1, 11, tzinfo=UTC))
    services.adjust_meter(
        allocation_id=allocation.id, microseconds=-30 * 60 * 1_000_000, reason="a slow node: half an hour back",
        author=operator, now=datetime(2024, 5, 1, 12, tzinfo=UTC),
    )  # fmt: skip
    entry = AuditEntry.objects.get(action="ledger.adjust")
    assert (entry.actor_user_id, entry.target) == (operator.id, f"team:{team.slug}")
    assert entry.after == {
        "allocation": allocation.id, "job": allocation.job_id, "gpu_hours": "-1.000000",
        "reason": "a slow node: half an hour back",
    }  # fmt: skip
