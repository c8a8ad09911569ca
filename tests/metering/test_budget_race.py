"""An enforced monthly budget holds under concurrent submissions (real commits, two connections)."""

import threading
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone

from jobs import declaration, dispatch, services
from jobs.models import Job
from metering import selectors
from metering import services as metering

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

    # Both projections are read before either job commits (the window of two concurrent requests);
    # serialised, the first waits here in vain (timeout) and the second reads after the first job is stored.
    barrier = threading.Barrier(2)
    original = selectors.projection

    def projection(**kwargs):
        answer = original(**kwargs)
        try:
            barrier.wait(timeout=3)
        except threading.BrokenBarrierError:
            pass
        return answer

    monkeypatch.setattr(selectors, "projection", projection)
    outcomes: list[str] = []

    def submit() -> None:
        try:
            services.submit_job(team=team, user=member, spec=spec, now=timezone.now())
            outcomes.append("accepted")
        except declaration.DeclarationInvalid:
            outcomes.append("refused")
        except BaseException as exc:  # reported by the assertion below
            outcomes.append(f"error: {exc!r}")
        finally:
            connection.close()

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    queued = Job.objects.filter(team=team).count()
    assert sorted(outcomes) == ["accepted", "refused"], (
        outcomes,
        f"{queued * 6} GPU-hours queued against 10",
    )
    assert queued == 1
