"""A team may have at most E31_MAX_WAITING_PER_TEAM tasks waiting (submitted, staging or queued): every scheduler
pass reads and plans each waiting job, under the one pass lock, so one team's flood would slow every start."""

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import tomli_w
from django.utils import timezone

from e31cli import main
from jobs import declaration, dependencies, dispatch, services
from jobs.models import Job
from tests.cli.inprocess import use_console
from tests.factories import JobFactory
from tests.jobs.intake_channels import error_fields, submit_api, submit_form
from tests.submissions import submit_twice_at_once


@pytest.fixture
def good(roots):
    _, out_root = roots
    return {
        "name": "train",
        "work": {"argv": ["python3", "train.py"]},
        "request": {"gpus": 1, "hours": 1.0},
        "output": {"uri": f"file://{out_root}/train", "bytes": 100},
    }


def _waiting(team, *states):
    for state in states:
        JobFactory(team=team, state=state)


@pytest.mark.django_db
def test_a_job_that_would_pass_the_cap_is_refused_in_the_form_and_the_api(
    good, pool, team, member_client, member_token, settings
):
    """Vision has 3 jobs waiting, one in each waiting state, against a cap of 3: a fourth is refused, the answer
    naming the cap, how many wait, and what to do."""
    settings.E31_MAX_WAITING_PER_TEAM = 3
    _waiting(team, "submitted", "staging", "queued")
    for response in (submit_form(member_client, good), submit_api(member_client, good, member_token)):
        assert response.status_code == 422
        assert "team" in error_fields(response)
        text = response.content.decode()
        assert "E31_MAX_WAITING_PER_TEAM" in text and "at most 3" in text and "3 tasks waiting" in text
        assert "cancel" in text and "operator" in text
    assert Job.objects.filter(team=team).count() == 3


@pytest.mark.django_db
def test_the_last_slot_is_taken_and_the_next_job_refused(good, pool, team, member, settings):
    settings.E31_MAX_WAITING_PER_TEAM = 2
    _waiting(team, "queued")
    spec = declaration.validate(good, limits=services.pool_limits(team=team))
    services.submit_job(team=team, user=member, spec=spec, now=timezone.now())
    with pytest.raises(declaration.DeclarationInvalid, match="at most 2"):
        services.submit_job(team=team, user=member, spec=spec, now=timezone.now())
    assert Job.objects.filter(team=team).count() == 2


@pytest.mark.django_db
def test_an_array_counts_every_task(good, pool, team, member, member_client, member_token, settings):
    """Cap 5, 2 waiting: an array of 4 tasks would make 6 and is refused whole; one of 3 fills the cap."""
    settings.E31_MAX_WAITING_PER_TEAM = 5
    _waiting(team, "queued", "submitted")
    response = submit_api(member_client, {**good, "array": "0-3"}, member_token)
    assert response.status_code == 422, response.content
    assert "adds 4" in response.content.decode()
    assert Job.objects.filter(team=team).count() == 2
    response = submit_api(member_client, {**good, "array": "0-2"}, member_token)
    assert response.status_code == 201, response.content
    assert Job.objects.filter(team=team, state__in=("submitted", "staging", "queued")).count() == 5


@pytest.mark.django_db
def test_only_waiting_jobs_count(good, pool, team, other_team, member, settings):
    """Jobs holding GPUs, ended ones, and other teams' waiting jobs leave the team's slots free."""
    settings.E31_MAX_WAITING_PER_TEAM = 2
    _waiting(team, "rented", "running", "output", "released", "ended", "queued")
    _waiting(other_team, "queued", "queued", "queued")
    spec = declaration.validate(good, limits=services.pool_limits(team=team))
    services.submit_job(team=team, user=member, spec=spec, now=timezone.now())
    assert Job.objects.filter(team=team, state="submitted").count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_submissions_cannot_both_take_the_last_slot(
    good, pool, team, member, settings, monkeypatch
):
    """One slot left; two members submit at the same moment: one is accepted, the other refused. Each count is
    held open until the other has counted too (a barrier); serialised on the team's row, the first waits there in
    vain and the second counts after the first job is stored."""
    monkeypatch.setattr(dispatch, "send_after_commit", lambda *a, **k: None)  # no broker traffic
    settings.E31_MAX_WAITING_PER_TEAM = 2
    _waiting(team, "queued")
    spec = declaration.validate(good, limits=services.pool_limits(team=team))
    # check_prerequisites: called by submit_job after the cap is weighed, before the job is stored
    outcomes = submit_twice_at_once(
        monkeypatch, team=team, user=member, spec=spec, held_at=(dependencies, "check_prerequisites")
    )
    waiting = Job.objects.filter(team=team, state__in=("submitted", "staging", "queued")).count()
    assert sorted(outcomes) == ["accepted", "refused"], (outcomes, f"{waiting} waiting against 2")
    assert waiting == 2


@pytest.mark.django_db
def test_e31_submit_says_why_and_exits_as_an_api_error(
    good, pool, team, member_token, settings, tmp_path, monkeypatch, capsys
):
    """`e31 submit` (the installed entry point) prints the API's refusal in one line and exits as a 422 does."""
    settings.E31_MAX_WAITING_PER_TEAM = 1
    _waiting(team, "queued")
    job_file = tmp_path / "train.toml"
    job_file.write_text(tomli_w.dumps(good))
    use_console(monkeypatch, member_token)
    monkeypatch.setattr(sys, "argv", ["e31", "submit", str(job_file)])
    with pytest.raises(SystemExit) as exit_:
        main.run()
    err = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert exit_.value.code == main.STATUS_EXITS.get(422, main.EXIT_API)
    assert "Error 422" in err and "E31_MAX_WAITING_PER_TEAM" in err and "1 task waiting" in err, err
    assert Job.objects.filter(team=team).count() == 1


@pytest.mark.django_db
def test_a_waiting_jobs_prerequisites_count_toward_the_cap(good, pool, team, member, settings):
    """Found by review: the pass reads and weighs each waiting job's prerequisites, so 2,000 waiting tasks of 64
    prerequisites each made a pass take 5.0 s against 1.6 s without. Every PREREQUISITES_PER_SLOT of them take
    one slot of the cap, as a waiting task does."""
    settings.E31_MAX_WAITING_PER_TEAM = 4
    per_slot = services.PREREQUISITES_PER_SLOT
    done = [JobFactory(team=team, state="released") for _ in range(2 * per_slot)]
    waiting = JobFactory(team=team, state="queued")
    dependencies.record(job_ids=[waiting.id], after_ok=[], after_any=[j.id for j in done])  # 1 + 2 slots
    spec = declaration.validate(good, limits=services.pool_limits(team=team))
    services.submit_job(team=team, user=member, spec=spec, now=timezone.now())  # the fourth slot
    with pytest.raises(declaration.DeclarationInvalid) as refused:
        services.submit_job(team=team, user=member, spec=spec, now=timezone.now())
    assert f"{2 * per_slot} prerequisites" in str(refused.value) and "at most 4" in str(refused.value)

    Job.objects.filter(state="submitted").delete()
    many = declaration.validate(
        {**good, "after_any": [j.id for j in done[:per_slot]]}, limits=services.pool_limits(team=team)
    )
    with pytest.raises(declaration.DeclarationInvalid, match="adds 1 task and 32 prerequisites"):
        services.submit_job(team=team, user=member, spec=many, now=timezone.now())  # 3 + 1 + 1 > 4


@pytest.mark.django_db
def test_a_team_submits_at_most_its_hourly_tasks_however_many_it_cancels(good, pool, team, member, settings):
    """The waiting cap is freed by a cancel: a token submitting a 1,000-task array and cancelling it, again and
    again, stored 1,000 jobs a round (and 146 MB with 64 long inputs each) with nothing to stop it. Tasks submitted
    in the last hour are counted too, cancelled or not; older ones are not."""
    settings.E31_MAX_SUBMITTED_PER_TEAM_HOUR = 5
    JobFactory(team=team, state="ended", submitted_at=timezone.now() - timedelta(minutes=61))
    spec = declaration.validate({**good, "array": "0-2"}, limits=services.pool_limits(team=team))
    first = services.submit_job(team=team, user=member, spec=spec, now=timezone.now())
    services.cancel_array(array_id=first.array_id, user=member, now=timezone.now())
    with pytest.raises(declaration.DeclarationInvalid) as refused:
        services.submit_job(team=team, user=member, spec=spec, now=timezone.now())
    ((field, message),) = refused.value.errors
    assert field == "team" and "E31_MAX_SUBMITTED_PER_TEAM_HOUR" in message
    assert "3 tasks in the last hour" in message and "at most 5" in message
    assert Job.objects.filter(team=team).count() == 4


@pytest.mark.django_db(False)
def test_an_hourly_cap_below_the_largest_array_is_refused_at_start():
    """Found in review: set below E31_MAX_ARRAY, the largest array could never be submitted, yet its refusal said
    to submit again later."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "e31web.settings", "E31_MAX_ARRAY": "1000",
           "E31_MAX_SUBMITTED_PER_TEAM_HOUR": "999"}  # fmt: skip
    started = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert started.returncode != 0
    assert "ImproperlyConfigured: E31_MAX_SUBMITTED_PER_TEAM_HOUR is at least E31_MAX_ARRAY" in started.stderr
