"""An enforced monthly budget holds under concurrent submissions (real commits, two connections)."""

import threading
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.utils import timezone

from accounts.models import Team
from jobs import declaration, dispatch, rental, services
from jobs.models import Job
from metering import selectors
from metering import services as metering
from tests.factories import JobFactory, NodeFactory
from tests.submissions import submit_twice_at_once

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_concurrent_submissions_cannot_both_pass_an_enforced_budget(
    team, member, operator, pool, roots, monkeypatch
):
    """Vision has an enforced budget of 10 GPU-hours and nothing used; two members submit 1 GPU x 6 h at the same
    moment (two browser tabs, two CI runners): one is accepted, the other refused, never 12 GPU-hours queued."""
    monkeypatch.setattr(dispatch, "send_after_commit", lambda *a, **k: None)  # no broker traffic
    metering.set_budget(
        team_id=team.id, gpu_hours=Decimal(10), enforced=True, operator=operator, now=timezone.now()
    )
    team.refresh_from_db()
    _, out_root = roots
    raw = {
        "name": "train",
        "work": {"argv": ["python3", "train.py"]},
        "request": {"gpus": 1, "hours": 6.0},
        "output": {"uri": f"file://{out_root}/train", "bytes": 100},
    }
    spec = declaration.validate(raw, limits=services.pool_limits(team=team))

    # Both projections are read before either job commits (the window of two concurrent requests).
    outcomes = submit_twice_at_once(
        monkeypatch, team=team, user=member, spec=spec, held_at=(selectors, "projection")
    )
    queued = Job.objects.filter(team=team).count()
    assert sorted(outcomes) == ["accepted", "refused"], (
        outcomes,
        f"{queued * 6} GPU-hours queued against 10",
    )
    assert queued == 1


def test_a_submission_weighing_its_budget_counts_a_job_the_scheduler_rents_while_it_reads(team, monkeypatch):
    """Vision has 100 GPU-hours enforced and a queued job of 4 GPUs x 20 h. A member submits 30 more while a pass
    rents the queued job between the budget's read of held GPUs and its read of queued jobs: the job counted in
    neither and the submission was let in at "30 of 100". RENT now waits for the team's ledger lock, which the
    budget's reads hold: the job is counted once, queued, and the submission is refused at 110."""
    Team.objects.filter(id=team.id).update(monthly_budget_gpu_hours=Decimal(100), budget_enforced=True)
    team.refresh_from_db()
    node = NodeFactory(name="gpu-race", gpus=8)
    waiting = JobFactory(team=team, state="queued", gpus=4, hours=20.0)
    monkeypatch.setattr(rental.dispatch, "run_part", lambda *a, **k: None)  # no agent in this test
    read_held, rented, passes = selectors._held_micros, [], []

    def rent() -> None:
        try:
            rented.append(
                rental.rent_job(job_id=waiting.id, gpus_by_node={node.name: (0, 1, 2, 3)}, now=timezone.now())
            )
        finally:
            connection.close()

    def held_then_a_pass_rents(**kwargs):
        found = read_held(**kwargs)
        passes.append(threading.Thread(target=rent))  # the scheduler pass, on its own connection
        passes[0].start()
        passes[0].join(timeout=1.0)  # it has committed by now, unless something holds it back
        return found

    monkeypatch.setattr(selectors, "_held_micros", held_then_a_pass_rents)
    with transaction.atomic():  # as services.submit_job weighs it, the team's row locked first
        Team.objects.select_for_update(no_key=True).filter(id=team.id).first()
        projection = selectors.projection(team=team, extra_gpu_hours=30.0, now=timezone.now())
    passes[0].join(timeout=30)
    assert rented == [True], "the pass did not rent the job"
    counted = projection.running_gpu_hours + projection.committed_gpu_hours + projection.queued_gpu_hours
    assert counted == pytest.approx(80.0, abs=0.1), projection.message
    assert projection.refused, projection.message
