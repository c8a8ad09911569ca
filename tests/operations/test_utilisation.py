"""Utilisation samples (busy, reserved, idle while jobs wait, per team) and the charts drawn from them."""

from datetime import timedelta

import pytest
from django.db.models import Sum
from django.urls import reverse

from jobs.lifecycle import State
from jobs.scheduling import types
from operations import services, utilisation
from operations.models import TeamBusySample, UtilisationSample
from tests.factories import JobFactory
from tests.operations.conftest import HTMX, running_job, store_samples

UTILISATION = reverse("operations:utilisation")


def _plan(reservations: list[types.Reservation]) -> types.Plan:
    return types.Plan(starts=[], preemptions=[], reservations=reservations, estimates={}, priority={})


def test_reserved_counts_only_free_gpus_a_reservation_holds_and_the_rest_idle_while_jobs_wait():
    nodes = [
        types.NodeView(name="a", gpus=4, free=(2, 3)),
        types.NodeView(name="b", gpus=4, free=(0, 1, 2, 3)),
        types.NodeView(name="c", gpus=4, free=(0, 1, 2, 3), schedulable=False),  # drained: not waste
    ]
    waiting = [types.PendingJob(job_id=1, team="t", gpus=8, hours=1, submitted_at=0)]
    held = types.Reservation(job_id=1, start_at=3600, gpus_by_node={"a": (0, 1, 2), "b": (0,)})
    figures = utilisation.measure(nodes=nodes, pending=waiting, plan=_plan([held]))
    assert (figures.total, figures.busy, figures.reserved, figures.idle_while_waiting) == (12, 2, 2, 4)
    assert figures.reservations["1"]["gpus_by_node"] == {"a": [0, 1, 2], "b": [0]}


def test_free_gpus_are_not_waste_when_no_job_is_ready_to_use_them():
    nodes = [types.NodeView(name="a", gpus=4, free=(0, 1, 2, 3))]
    staging = [types.PendingJob(job_id=1, team="t", gpus=1, hours=1, submitted_at=0, ready_at=99.0)]
    figures = utilisation.measure(nodes=nodes, pending=staging, plan=_plan([]))
    assert (figures.idle_while_waiting, figures.queued) == (0, 0)


@pytest.mark.django_db
def test_a_sample_records_the_pool_and_each_teams_busy_gpus_once_a_minute(pool, team, other_team, now):
    now = now.replace(second=0)
    running_job(team=team, node=pool[0], gpus=2, now=now - timedelta(minutes=10))
    running_job(team=other_team, node=pool[1], gpus=1, now=now - timedelta(minutes=10))
    big = JobFactory(
        team=other_team, gpus=8, state=State.QUEUED, submitted_at=now
    )  # must wait: a reservation
    sample = services.sample_utilisation(now=now)
    assert (sample.total_gpus, sample.busy_gpus, sample.queued_jobs) == (8, 3, 1)
    assert sample.reserved_gpus == 5 and sample.idle_while_waiting_gpus == 0
    assert set(sample.reservations) == {str(big.id)}
    assert dict(sample.teams.values_list("team_id", "busy_gpus")) == {team.id: 2, other_team.id: 1}
    assert services.sample_utilisation(now=now + timedelta(seconds=20)) is None  # same minute: nothing more
    assert UtilisationSample.objects.count() == 1


@pytest.mark.django_db
def test_a_new_sample_prunes_those_older_than_the_retention(team, now):
    store_samples(start=now - timedelta(days=40), minutes=3, total=8, busy=1, team_busy={team.id: 1})
    store_samples(start=now - timedelta(days=29), minutes=3, total=8, busy=1, team_busy={team.id: 1})
    services.sample_utilisation(now=now)
    assert UtilisationSample.objects.count() == 4 and TeamBusySample.objects.count() == 3


@pytest.mark.django_db
def test_the_sampler_never_starts_or_changes_a_job(pool, team, now):
    job = JobFactory(team=team, gpus=1, state=State.QUEUED, submitted_at=now)
    sample = services.sample_utilisation(now=now)
    job.refresh_from_db()
    assert job.state == State.QUEUED and not job.allocations.exists()
    assert sample.idle_while_waiting_gpus == 8  # a 1-GPU job waits beside 8 idle GPUs: pure waste


@pytest.mark.django_db
def test_buckets_average_the_pool_and_sum_team_gpu_hours(team, now):
    start = now.replace(minute=0) - timedelta(hours=3)
    store_samples(start=start, minutes=60, total=16, busy=4, team_busy={team.id: 4})
    store_samples(start=start + timedelta(hours=1), minutes=60, total=16, busy=12, team_busy={team.id: 12})
    window = utilisation.WINDOWS["24h"]
    buckets = utilisation.pool_series(window=window, now=now)
    assert len(buckets) == 12 and {b.busy for b in buckets} == {4, 12}
    assert all(b.samples == 10 and b.total == 16 for b in buckets)
    hours = utilisation.team_series(window=window, now=now)[team.id]
    assert sum(hours.values()) == pytest.approx(4 + 12)  # 60 min x 4 GPUs + 60 min x 12 GPUs
    assert TeamBusySample.objects.aggregate(m=Sum("busy_gpus"))["m"] / 60 == 16


@pytest.mark.django_db
def test_the_utilisation_page_draws_svg_charts_by_state_and_by_team(operator_client, team, other_team, now):
    store_samples(
        start=now - timedelta(hours=2), minutes=90, total=8, busy=6, team_busy={team.id: 4, other_team.id: 2}
    )
    page = operator_client.get(UTILISATION).content.decode()
    assert page.count("<svg") == 3
    assert '<rect class="u-busy"' in page and '<rect class="u-waste"' in page
    assert (
        f'<rect class="team-c{team.id % 12}"' in page and f'<rect class="team-c{other_team.id % 12}"' in page
    )
    assert "vision: 6.00 GPU-h" in page and "audio: 3.00 GPU-h" in page  # 90 min x 4 and x 2 GPUs
    assert "9.0</strong> GPU-hours busy" in page and "3.0</strong> GPU-hours idle while jobs waited" in page
    assert " style=" not in page and "<script>" not in page


@pytest.mark.django_db
def test_each_range_has_its_own_buckets_and_the_fragment_polls_itself(operator_client, team, now):
    store_samples(start=now - timedelta(days=3), minutes=30, total=8, busy=8, team_busy={team.id: 8})
    week = operator_client.get(UTILISATION, {"range": "7d"}).content.decode()
    assert "last 7 days" in week and '<rect class="u-busy"' in week
    day = operator_client.get(UTILISATION, {"range": "24h"}).content.decode()
    assert '<rect class="u-busy"' not in day and "No team held GPUs in this range" in day
    fragment = operator_client.get(UTILISATION, {"range": "30d"}, **HTMX).content.decode()
    assert fragment.lstrip().startswith('<section id="utilisation-30d-charts"') and "hx-trigger" in fragment
