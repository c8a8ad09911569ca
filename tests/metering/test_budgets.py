"""Budget projections: used (ledger) + running + queued + this job, against the monthly budget."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.urls import reverse

from accounts.models import Team
from jobs.lifecycle import State
from metering import selectors, services
from operations.models import AuditEntry
from tests.factories import JobFactory
from tests.metering.conftest import release, rent

pytestmark = pytest.mark.django_db

NOW = datetime(2024, 5, 20, 12, 30, tzinfo=UTC)


@pytest.fixture
def busy_team(team, node):
    """300 GPU-hours released this month, 4 GPUs held for 3 h, 2 x 10 h queued; 50 GPU-hours in April."""
    done = rent(team=team, node=node, at=datetime(2024, 5, 3, tzinfo=UTC), gpus=4)
    release(done, at=datetime(2024, 5, 6, 3, tzinfo=UTC))  # 75 h x 4 GPUs
    old = rent(
        team=team,
        node=node,
        at=datetime(2024, 4, 30, 23, tzinfo=UTC) - timedelta(hours=24),
        gpus=2,
        name="old",
    )
    release(old, at=datetime(2024, 5, 1, tzinfo=UTC))  # ends on the month boundary: all April
    rent(team=team, node=node, at=NOW - timedelta(hours=3), gpus=4, name="running")
    services.accrue_meter(now=NOW)
    JobFactory(team=team, state=State.QUEUED, gpus=2, hours=10.0)
    JobFactory(team=team, state=State.RELEASED, end_reason="succeeded", gpus=8, hours=100.0)
    return team


def _budget(team: Team, hours: str | None, enforced: bool) -> Team:
    team.monthly_budget_gpu_hours = None if hours is None else Decimal(hours)
    team.budget_enforced = enforced
    team.save()
    return team


def test_the_projection_counts_ledger_running_and_queued_hours_of_this_month_only(busy_team):
    p = selectors.projection(team=_budget(busy_team, "400", True), extra_gpu_hours=20.0, now=NOW)
    assert p.used_gpu_hours == pytest.approx(300 + 4 * 2.5)  # April excluded; closed hours of the running job
    assert p.running_gpu_hours == pytest.approx(4 * 0.5)  # 12:00 to 12:30, not closed yet
    assert p.queued_gpu_hours == pytest.approx(20.0)
    assert p.total_gpu_hours == pytest.approx(352.0)
    assert not p.would_exceed and not p.refused


def test_an_enforced_budget_refuses_with_a_clear_sentence(busy_team):
    p = selectors.projection(team=_budget(busy_team, "400", True), extra_gpu_hours=80.0, now=NOW)
    assert p.would_exceed and p.enforced and p.refused
    assert p.message == (
        "This job would bring team vision to 412 of 400 GPU-hours this month "
        "(used 310, running 2, queued 20, this job 80). The budget is enforced, so this job is refused."
    )


def test_an_unenforced_budget_only_warns(busy_team):
    p = selectors.projection(team=_budget(busy_team, "400", False), extra_gpu_hours=80.0, now=NOW)
    assert p.would_exceed and not p.refused
    assert p.message.endswith("The budget is not enforced: this is a warning only.")
    assert "412 of 400 GPU-hours" in p.message


def test_a_team_without_a_budget_never_exceeds(busy_team):
    p = selectors.projection(team=_budget(busy_team, None, True), extra_gpu_hours=10_000.0, now=NOW)
    assert not p.would_exceed and p.budget_gpu_hours is None
    assert "no monthly budget" in p.message


def test_set_budget_is_for_operators_only(team, member, operator):
    with pytest.raises(PermissionError):
        services.set_budget(team_id=team.id, gpu_hours=Decimal("5"), enforced=True, operator=member, now=NOW)
    services.set_budget(
        team_id=team.id, gpu_hours=Decimal("12.5"), enforced=False, operator=operator, now=NOW
    )
    team.refresh_from_db()
    assert (team.monthly_budget_gpu_hours, team.budget_enforced) == (Decimal("12.5"), False)


def test_setting_a_teams_budget_is_recorded_in_the_audit_log(operator_client, team):
    """An operator sets team vision's budget to 10 GPU-hours a month, enforced, on the budget page: one
    audit entry team.budget on team:vision holds who did it and the budget before and after."""
    Team.objects.filter(id=team.id).update(monthly_budget_gpu_hours=None, budget_enforced=False)
    response = operator_client.post(
        reverse("metering:budget", args=[team.slug]),
        {"monthly_budget_gpu_hours": "10", "budget_enforced": "on"},
    )
    assert response.status_code == 302
    entry = AuditEntry.objects.get(target=f"team:{team.slug}")
    assert (entry.action, entry.actor) == ("team.budget", "olga")
    assert entry.before == {"monthly_budget_gpu_hours": None, "budget_enforced": False}
    assert entry.after == {"monthly_budget_gpu_hours": "10", "budget_enforced": True}


def test_a_budget_refused_as_negative_leaves_no_audit_entry(team, operator):
    """An operator's negative budget is refused: nothing changes, so nothing is audited."""
    with pytest.raises(ValueError, match="a budget cannot be negative"):
        services.set_budget(
            team_id=team.id, gpu_hours=Decimal("-1"), enforced=True, operator=operator, now=NOW
        )
    assert not AuditEntry.objects.exists()


def _long_running(team, node, *, gpus: int, hours: float, started: datetime) -> None:
    allocation = rent(team=team, node=node, at=started, gpus=gpus, name="long")
    type(allocation.job).objects.filter(id=allocation.job_id).update(hours=hours)


def test_a_running_job_counts_to_its_declared_limit_not_only_up_to_now(team, node):
    """A team with 100 GPU-hours a month, enforced, runs 4 GPUs for up to 20 h, started an hour ago: 80 GPU-hours
    are spoken for. Before, only the hour already run counted, so a 30-GPU-hour job was let in and the month
    could end at 110; the same job queued counted all 80, so starting it freed budget it was about to spend."""
    _budget(team, "100", True)
    _long_running(team, node, gpus=4, hours=20.0, started=NOW - timedelta(hours=1))
    p = selectors.projection(team=team, extra_gpu_hours=30.0, now=NOW)
    assert p.running_gpu_hours == pytest.approx(4.0)
    assert p.committed_gpu_hours == pytest.approx(76.0)
    assert p.total_gpu_hours == pytest.approx(110.0)
    assert p.refused
    assert p.message == (
        "This job would bring team vision to 110 of 100 GPU-hours this month (used 0, running 4, "
        "76 more to the running jobs' limits, queued 0, this job 30). The budget is enforced, so this job is refused."
    )


def test_what_a_running_job_may_still_use_stops_at_the_months_end(team, node):
    """Started on the 31st at 20:00 for 10 h on 2 GPUs: at 22:00 the month has 2 h left, so 4 GPU-hours
    of the 16 to come fall in this month; the rest is next month's."""
    now = datetime(2024, 5, 31, 22, tzinfo=UTC)
    _long_running(team, node, gpus=2, hours=10.0, started=now - timedelta(hours=2))
    p = selectors.projection(team=team, extra_gpu_hours=0.0, now=now)
    assert p.committed_gpu_hours == pytest.approx(4.0)


def test_a_job_past_its_limit_commits_nothing_more(team, node):
    _long_running(team, node, gpus=2, hours=1.0, started=NOW - timedelta(hours=3))
    assert selectors.projection(team=team, extra_gpu_hours=0.0, now=NOW).committed_gpu_hours == 0.0


def test_a_part_whose_process_has_exited_commits_nothing_more_while_it_is_released(team, node):
    """Its process ended an hour into 20 h; until its part is sealed and released it still holds its GPUs (metered
    as run), but it will use none of the 19 h left: a submission meanwhile is not refused for them."""
    _long_running(team, node, gpus=4, hours=20.0, started=NOW - timedelta(hours=1))
    type(node).objects.get(id=node.id).allocations.update(finished_at=NOW - timedelta(minutes=1))
    p = selectors.projection(team=team, extra_gpu_hours=0.0, now=NOW)
    assert p.committed_gpu_hours == 0.0 and p.running_gpu_hours == pytest.approx(4.0)
