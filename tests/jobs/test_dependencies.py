"""Jobs that run after others: after_ok / after_any, the team's own jobs only, held in the queue with a
reason, ended dependency_failed (never metered) when a prerequisite did not succeed."""

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from jobs import declaration, dispatch, presenters, rental, scheduler, selectors, services, staging
from jobs.models import Dependency, Job, TeamUsage
from tests.factories import JobFactory
from tests.jobs.intake_channels import error_fields, submit_api, submit_file

pytestmark = pytest.mark.django_db


@pytest.fixture
def raw(roots):
    _, out_root = roots
    return {
        "name": "train",
        "work": {"argv": ["python3", "train.py"]},
        "request": {"gpus": 1, "hours": 1.0},
        "output": {"uri": f"file://{out_root}/train", "bytes": 100},
    }


def _submit(team, user, raw, **extra):
    spec = declaration.validate({**raw, **extra}, limits=services.pool_limits(team=team))
    return services.submit_job(team=team, user=user, spec=spec, now=timezone.now())


def _queued(job: Job) -> Job:
    Job.objects.filter(id=job.id).update(state="queued")
    return job


def _pass() -> None:
    scheduler.run_pass(now=timezone.now())


def test_a_job_file_and_the_api_declare_after_ok_and_after_any(team, member, member_token, client, pool, raw):
    first, second = JobFactory(team=team), JobFactory(team=team)
    by_file = submit_file(client_for(member), {**raw, "after_ok": [first.id], "after_any": [second.id]})
    assert by_file.status_code == 302, by_file.content
    by_api = submit_api(client, {**raw, "after_ok": [first.id, second.id]}, member_token)
    assert by_api.status_code == 201, by_api.content
    assert by_api.json()["after_ok"] == [first.id, second.id] and by_api.json()["after_any"] == []
    kinds = sorted(Dependency.objects.values_list("prerequisite_id", "kind"))
    assert kinds == sorted(
        [(first.id, "after_ok"), (second.id, "after_any"), (first.id, "after_ok"), (second.id, "after_ok")]
    )


def client_for(user):
    from django.test import Client

    c = Client()
    c.force_login(user)
    return c


@pytest.mark.parametrize(
    ("value", "field"),
    [("812", "after_ok"), ([True], "after_ok[0]"), ([0], "after_ok[0]"), ([1, 1], "after_ok[1]")],
)
def test_malformed_prerequisites_are_refused_with_their_field(client, member_token, pool, raw, value, field):
    response = submit_api(client, {**raw, "after_ok": value}, member_token)
    assert response.status_code == 422 and field in error_fields(response)


def test_another_teams_job_is_refused_exactly_as_a_job_that_does_not_exist(
    team, other_team, member, pool, raw
):
    foreign = JobFactory(team=other_team)
    missing = foreign.id + 1000
    messages = []
    for job_id in (foreign.id, missing):
        with pytest.raises(declaration.DeclarationInvalid) as refused:
            _submit(team, member, raw, after_any=[job_id])
        messages.append(refused.value.as_dict()["after_any[0]"].replace(str(job_id), "N"))
    assert messages[0] == messages[1] == "no job N in your team"
    assert not Job.objects.filter(name="train").exists()


def test_a_cycle_cannot_be_declared_a_job_can_only_wait_for_older_jobs(team, member, pool, raw):
    earlier = _submit(team, member, raw)
    with pytest.raises(declaration.DeclarationInvalid) as refused:
        _submit(team, member, raw, after_ok=[earlier.id + 1])  # the id the new job itself would take
    assert "after_ok[0]" in refused.value.as_dict()
    later = _submit(team, member, raw)
    with pytest.raises(IntegrityError), transaction.atomic():  # and the database refuses a writer that tries
        Dependency.objects.create(job=earlier, prerequisite=later, kind=Dependency.AFTER_OK)


def test_after_ok_on_a_job_that_already_failed_is_refused_at_intake(team, member, pool, raw):
    failed = JobFactory(team=team, state="released", end_reason="failed")
    with pytest.raises(declaration.DeclarationInvalid) as refused:
        _submit(team, member, raw, after_ok=[failed.id])
    assert (
        refused.value.as_dict()["after_ok[0]"]
        == f"job {failed.id} already ended failed: this job could never start"
    )
    assert _submit(team, member, raw, after_any=[failed.id]).prerequisites.count() == 1


def test_a_job_waits_queued_with_a_reason_while_its_prerequisite_runs_then_starts_after_it_succeeds(
    team, member, pool, raw
):
    pre = _queued(_submit(team, member, raw))
    job = _queued(_submit(team, member, raw, after_ok=[pre.id]))
    _pass()
    pre.refresh_from_db(), job.refresh_from_db()
    assert pre.state == "rented" and job.state == "queued"
    assert job.pending_reason.startswith(f"waiting for job {pre.id} to succeed (expected to end by ")
    assert job.estimated_start is not None
    rental.release_job(job_id=pre.id, end_reason="succeeded", now=timezone.now(), actor="agent")
    _pass()
    job.refresh_from_db()
    assert job.state == "rented"


def test_a_failed_prerequisite_ends_its_dependents_unmetered_down_the_chain(team, member, pool, raw):
    pre = _queued(_submit(team, member, raw))
    train = _queued(_submit(team, member, raw, after_ok=[pre.id]))
    evaluate = _submit(team, member, raw, after_ok=[train.id])  # still before staging
    report = _queued(_submit(team, member, raw, after_any=[pre.id]))
    _pass()
    rental.release_job(job_id=pre.id, end_reason="failed", now=timezone.now(), actor="agent", exit_code=3)
    _pass()
    for job in (train, evaluate, report):
        job.refresh_from_db()
    assert (train.state, train.end_reason) == ("ended", "dependency_failed")
    assert train.end_detail == f"job {pre.id} ended failed; this job ran only after it succeeded"
    assert (evaluate.state, evaluate.end_reason) == ("ended", "dependency_failed")
    assert not train.allocations.exists() and not evaluate.allocations.exists()
    assert report.state == "rented"  # after_any: it ran once the prerequisite ended, however it ended


def test_a_prerequisite_whose_outputs_failed_to_deliver_did_not_succeed(team, member, pool, raw):
    pre = JobFactory(team=team, state="released", end_reason="succeeded", delivery_state="delivering")
    job = _queued(_submit(team, member, raw, after_ok=[pre.id]))
    _pass()
    job.refresh_from_db()
    assert job.state == "queued" and job.pending_reason == f"waiting for job {pre.id} to succeed"
    Job.objects.filter(id=pre.id).update(delivery_state="failed")
    _pass()
    job.refresh_from_db()
    assert job.end_reason == "dependency_failed"


def test_the_job_page_shows_the_pipeline_around_the_job(team, member, member_client, pool, raw):
    pre = _submit(team, member, {**raw, "name": "preprocess"})
    job = _submit(team, member, {**raw, "name": "train"}, after_ok=[pre.id])
    after = _submit(team, member, {**raw, "name": "evaluate"}, after_any=[job.id])
    page = member_client.get(f"/jobs/{job.id}/").content.decode()
    pipeline = page[page.index(f'id="job-{job.id}-pipeline"') :]
    assert (
        pipeline.index(f"#{pre.id} preprocess")
        < pipeline.index(f"#{job.id} train")
        < pipeline.index(f"#{after.id} evaluate")
    )
    assert "must succeed first" in pipeline


def test_a_step_is_staged_only_once_its_prerequisite_has_succeeded_so_it_reads_what_that_wrote(
    team, member, pool, roots, raw, monkeypatch
):
    """`train` reads features.bin, which `prepare` writes: staged at submit it would find no file (or an
    older copy). It waits unstaged, with its reason, and the pass after `prepare` succeeds stages it."""
    data, _ = roots
    rung: list[int] = []
    monkeypatch.setattr(dispatch, "stage_job", lambda job_id, **_: rung.append(job_id))
    prepare = _queued(_submit(team, member, raw))
    features = {"name": "features", "uri": f"file://{data}/features.bin", "bytes": 5}
    train = _submit(team, member, raw, after_ok=[prepare.id], data=[features])
    assert rung == [prepare.id]
    assert not staging.stage_job(
        job_id=train.id, now=timezone.now()
    )  # a redelivered task stages nothing either
    _pass()
    train.refresh_from_db()
    assert train.state == "submitted" and train.pending_reason.startswith(
        f"waiting for job {prepare.id} to succeed"
    )

    (data / "features.bin").write_bytes(b"12345")  # what prepare wrote
    rental.release_job(job_id=prepare.id, end_reason="succeeded", now=timezone.now(), actor="agent")
    _pass()
    assert rung == [prepare.id, train.id]
    staging.stage_job(job_id=train.id, now=timezone.now())
    train.refresh_from_db()
    assert train.state == "queued", train.end_detail


def test_a_job_whose_prerequisites_are_already_met_is_staged_at_submit(team, member, pool, raw, monkeypatch):
    rung: list[int] = []
    monkeypatch.setattr(dispatch, "stage_job", lambda job_id, **_: rung.append(job_id))
    done = JobFactory(team=team, state="released", end_reason="succeeded")
    job = _submit(team, member, raw, after_ok=[done.id])
    assert rung == [job.id]


def test_a_rerun_of_a_pipeline_step_waits_for_the_same_prerequisites(
    team, member, member_token, client, pool, raw
):
    """A re-run is the job as it was declared: cancelled by mistake and re-run, the step still waits for
    the running job it named, rather than start at once and read outputs not yet written."""
    prepare = _queued(_submit(team, member, raw))
    _pass()
    train = _submit(team, member, raw, after_ok=[prepare.id])
    assert services.cancel_job(job_id=train.id, user=member, now=timezone.now())

    answer = client.post(f"/api/v1/jobs/{train.id}/rerun", HTTP_AUTHORIZATION=f"Bearer {member_token}")
    assert answer.status_code == 201, answer.content
    assert answer.json()["after_ok"] == [prepare.id]
    _pass()
    rerun = Job.objects.get(id=answer.json()["id"])
    assert rerun.state == "submitted" and rerun.pending_reason.startswith(f"waiting for job {prepare.id}")


def test_a_job_held_by_its_prerequisite_ages_only_once_it_may_run(team, other_team, pool):
    """Reproduction: vision, far past its share, submitted a placeholder P and D (after_any P) two days ago, then
    cancelled P (never run, never metered): D was ranked as if it had queued those two days (priority 58.9 against
    2.17) and took the reservation from audio's equal job, queued for the past hour. Its age counts from when its
    prerequisite ended."""
    now = timezone.now()
    TeamUsage.objects.create(team=team, gpu_seconds=1e8, as_of=now)
    fillers = [
        JobFactory(team=other_team, gpus=4, hours=2.0, submitted_at=now - timedelta(hours=1)) for _ in pool
    ]
    scheduler.run_pass(now=now - timedelta(hours=1))
    assert set(Job.objects.filter(id__in=[f.id for f in fillers]).values_list("state", flat=True)) == {
        "rented"
    }
    two_days_ago = now - timedelta(days=2)
    placeholder = JobFactory(team=team, gpus=8, hours=0.01, submitted_at=two_days_ago, state="ended",
                             end_reason="cancelled", state_changed_at=now - timedelta(minutes=1))  # fmt: skip
    held = JobFactory(team=team, gpus=4, hours=0.25, submitted_at=two_days_ago)
    Dependency.objects.create(job=held, prerequisite=placeholder, kind="after_any")
    theirs = JobFactory(team=other_team, gpus=4, hours=0.25, submitted_at=now - timedelta(hours=1))

    scheduler.run_pass(now=now)

    held.refresh_from_db()
    theirs.refresh_from_db()
    assert held.priority < theirs.priority, (held.priority_detail, theirs.priority_detail)
    assert "reserved on" in theirs.pending_reason and "reserved on" not in held.pending_reason


def test_a_pass_ends_a_bounded_number_of_dependents_and_asks_for_another(
    team, member, pool, raw, monkeypatch
):
    """Reproduction: a head job and two arrays of 1,999 tasks after_ok it, then the head cancelled (never metered):
    the next pass ended all 1,999 under the pool-wide pass lock, one by one, 10.6 s during which no job of any
    team started (a chain of 2,000 took 17.5 s); the team's waiting count then emptied, so it could repeat."""
    monkeypatch.setattr(scheduler, "END_PER_PASS", 5)
    monkeypatch.setattr(dispatch, "stage_job", lambda *a, **k: None)
    asked = []
    monkeypatch.setattr(dispatch, "request_scheduler_pass", lambda: asked.append(1))
    head = _submit(team, member, raw)
    _submit(team, member, raw, after_ok=[head.id], array="0-11")
    assert services.cancel_job(job_id=head.id, user=member, now=timezone.now())
    asked.clear()

    _pass()
    assert Job.objects.filter(end_reason="dependency_failed").count() == 5 and asked
    left = Job.objects.filter(array__isnull=False).exclude(end_reason="dependency_failed")
    assert set(left.values_list("state", flat=True)) == {"submitted"}  # held, never planned, until ended
    _pass()
    _pass()
    assert Job.objects.filter(end_reason="dependency_failed").count() == 12


def test_the_job_page_and_the_api_name_a_page_of_dependents_never_all(
    team, member, member_client, member_token
):
    """Found by review: a job 100,000 others waited for took 17.7 s to show (9.6 s for each 2-second refresh of its
    live part) and 3.0 s in the API, which read and listed them all."""
    first = JobFactory(team=team, state="running")
    count = max(presenters.DEPENDENTS_SHOWN, selectors.DEPENDENTS_LISTED) + 5
    waiting = JobFactory.create_batch(count, team=team, state="queued")
    Dependency.objects.bulk_create(
        Dependency(job=j, prerequisite=first, kind=Dependency.AFTER_ANY) for j in waiting
    )

    page = member_client.get(f"/jobs/{first.id}/").content.decode()
    shown = [j for j in waiting if f"/jobs/{j.id}/" in page]
    assert shown == waiting[: presenters.DEPENDENTS_SHOWN]
    assert f"and {count - presenters.DEPENDENTS_SHOWN} more jobs that run after this one" in page

    body = member_client.get(f"/api/v1/jobs/{first.id}", HTTP_AUTHORIZATION=f"Bearer {member_token}").json()
    assert body["dependents"] == [j.id for j in waiting][: selectors.DEPENDENTS_LISTED]
    assert body["dependents_total"] == len(waiting)
