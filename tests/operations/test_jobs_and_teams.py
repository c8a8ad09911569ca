"""All jobs with filters; cancel and requeue from the list; team pages with share, budget and use."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from accounts.models import Team
from common import paging
from jobs import scheduler
from jobs import services as jobs_services
from jobs.lifecycle import EndReason, State
from jobs.models import DataInput, Dependency, Job, JobArray
from operations import services
from operations.models import AuditEntry
from tests.factories import JobFactory, MembershipFactory, UserFactory
from tests.operations.conftest import HTMX, running_job

pytestmark = pytest.mark.django_db
JOBS = reverse("operations:jobs")


def job_action(job: Job, action: str) -> str:
    return reverse("operations:job-action", args=[job.id, action])


def _said(response) -> str:
    return " ".join(str(m) for m in get_messages(response.wsgi_request))


def test_the_jobs_list_filters_by_team_state_end_reason_node_and_date(
    operator_client, team, other_team, pool, now
):
    old = JobFactory(team=team, name="old-one", state=State.ENDED, end_reason=EndReason.CANCELLED,
                     submitted_at=datetime(2024, 1, 5, 12, tzinfo=UTC))  # fmt: skip
    JobFactory(team=other_team, name="audio-queued")
    on_node = running_job(team=team, node=pool[1], now=now, name="on-gpu-02")

    def listed(**query) -> str:
        return operator_client.get(JOBS, query).content.decode()

    assert "audio-queued" in listed(team="audio") and "old-one" not in listed(team="audio")
    assert "old-one" in listed(state="ended") and "on-gpu-02" not in listed(state="ended")
    assert "old-one" in listed(end_reason="cancelled") and "audio-queued" not in listed(
        end_reason="cancelled"
    )
    by_node = listed(node="gpu-02")
    assert "on-gpu-02" in by_node and "old-one" not in by_node and "audio-queued" not in by_node
    assert f'id="job-{old.id}-row"' in listed(since="2024-01-05", until="2024-01-05")
    assert "on-gpu-02" not in listed(since="2024-01-05", until="2024-01-05")
    assert "on-gpu-02" in listed(since="not-a-date")  # a malformed filter is ignored
    assert f'id="job-{on_node.id}-row"' in listed(until="2999-02-31")


def test_the_jobs_list_names_an_array_tasks_index_and_its_array(operator_client, team):
    """Every task of an array bears the array's name: without its index the rows cannot be told apart."""
    array = JobArray.objects.create(team=team, name="sweep", spec="0-3", size=4, max_running=None, first_index=0,
                                    submitted_at=datetime(2024, 1, 5, 12, tzinfo=UTC))  # fmt: skip
    task = JobFactory(team=team, name="sweep", array=array, array_index=2)
    page = operator_client.get(JOBS).content.decode()
    assert f"task 2 of array {array.id}" in page and f"/jobs/{task.id}/" in page


@pytest.mark.parametrize(
    "query",
    [{"until": "9999-12-31"}, {"since": "9999-12-31"}, {"since": "0001-01-01", "until": "0001-01-01"}],
)
def test_the_jobs_list_filtered_at_the_ends_of_the_calendar_answers(operator_client, team, query):
    """An operator (or a bookmarked link) filters the jobs list by the first or last day a date can name:
    the page answers, and until the last day means no upper bound."""
    job = JobFactory(team=team)
    operator_client.raise_request_exception = False
    response = operator_client.get(JOBS, query)
    assert response.status_code == 200
    listed = f'id="job-{job.id}-row"' in response.content.decode()
    assert listed == (query == {"until": "9999-12-31"})


def test_cancel_from_the_list_is_confirmed_recorded_and_ends_a_waiting_job(operator_client, team):
    job = JobFactory(team=team, state=State.QUEUED)
    assert 'name="confirm"' in operator_client.get(job_action(job, "cancel")).content.decode()
    assert operator_client.post(job_action(job, "cancel")).status_code == 422
    job.refresh_from_db()
    assert job.state == State.QUEUED

    answer = operator_client.post(job_action(job, "cancel"), {"confirm": "yes"}, follow=True)
    job.refresh_from_db()
    assert (job.state, job.end_reason) == (State.ENDED, EndReason.CANCELLED)
    # It held no GPUs: the page said "a job holding GPUs stops and is released" all the same.
    assert f"Job #{job.id}: cancelled (it ended without running, unmetered)." in answer.content.decode()
    entry = AuditEntry.objects.get(action="job.cancel")
    assert (
        entry.target == f"job:{job.id}"
        and entry.before["state"] == "queued"
        and entry.after["state"] == "ended"
    )


def test_cancelling_a_running_job_asks_its_agent_to_stop_it(operator_client, team, pool, now):
    job = running_job(team=team, node=pool[0], now=now)
    answer = operator_client.post(job_action(job, "cancel"), {"confirm": "yes"}, follow=True)
    job.refresh_from_db()
    assert job.state == State.RUNNING and job.cancel_requested_at is not None
    assert "its process, if it started, stops and its GPUs are released" in answer.content.decode()
    assert AuditEntry.objects.get(action="job.cancel").after["cancel_requested_at"]


def test_requeue_resubmits_an_ended_jobs_declaration_as_a_new_job(operator_client, operator, team, pool, now):
    job = running_job(team=team, node=pool[0], gpus=2, now=now, argv=["python", "train.py"], env={"SEED": "1"},
                      hours=3.0, min_gpus=1, output_uri="file:///tmp/out/run")  # fmt: skip
    DataInput.objects.create(job=job, position=0, name="imagenet", uri="file:///data/imagenet", bytes=10**9)
    job.allocations.update(released_at=now)  # as if released: the test needs only its declaration
    Job.objects.filter(id=job.id).update(state=State.RELEASED, end_reason=EndReason.FAILED)

    response = operator_client.post(job_action(job, "requeue"), {"confirm": "yes"})

    copy = Job.objects.exclude(id=job.id).get()
    assert response["Location"] == reverse("jobs:detail", args=[copy.id])
    assert (copy.team, copy.state, copy.submitted_by) == (team, State.SUBMITTED, operator)
    fields = ("name", "argv", "env", "gpus", "hours", "min_gpus", "output_uri", "requeue", "preemptible")
    assert [getattr(copy, f) for f in fields] == [getattr(job, f) for f in fields]
    assert list(copy.inputs.values_list("name", "uri", "bytes")) == [
        ("imagenet", "file:///data/imagenet", 10**9)
    ]
    entry = AuditEntry.objects.get(action="job.requeue")
    assert entry.before == {"state": "released", "end_reason": "failed"}
    assert entry.after["requeued_as"] == copy.id


def test_requeue_copies_the_whole_declaration_secrets_bounds_and_checkpoint_included(operator, team, now):
    job = JobFactory(
        team=team, state=State.RELEASED, end_reason=EndReason.NODE_LOST, gpus=2, max_gpus=4, preemptible=True,
        memory_bytes=8 * 2**30, cpus=6.0, secrets=["WANDB_API_KEY"], checkpoint_signal="USR1",
        checkpoint_grace_s=300, checkpoint_bytes=2**30,
    )  # fmt: skip
    copy = services.requeue_job(job_id=job.id, actor=operator, now=now)
    copy.refresh_from_db()
    fields = ("memory_bytes", "cpus", "max_gpus", "secrets", "checkpoint_signal", "checkpoint_grace_s")
    assert [getattr(copy, f) for f in fields] == [8 * 2**30, 6.0, 4, ["WANDB_API_KEY"], "USR1", 300]
    assert copy.checkpoint_bytes == 2**30


def test_requeue_of_a_waiting_job_cancels_it_so_only_its_copy_waits(operator, team, now):
    job = JobFactory(team=team, state=State.STAGING)
    copy = services.requeue_job(job_id=job.id, actor=operator, now=now)
    job.refresh_from_db()
    assert (job.state, job.end_reason) == (State.ENDED, EndReason.CANCELLED)
    assert (
        copy.state == State.SUBMITTED and Job.objects.filter(state__in=["submitted", "staging"]).count() == 1
    )


def test_requeue_of_a_job_holding_gpus_is_refused(operator_client, team, pool, now):
    job = running_job(team=team, node=pool[0], now=now)
    assert operator_client.get(job_action(job, "requeue")).status_code == 409
    assert operator_client.post(job_action(job, "requeue"), {"confirm": "yes"}).status_code == 409
    assert Job.objects.count() == 1 and not AuditEntry.objects.exists()
    with pytest.raises(services.RequeueRefused):
        services.requeue_job(job_id=job.id, actor="olga", now=now)


def test_requeue_refused_by_the_teams_enforced_budget_is_shown_and_changes_nothing(operator_client, team):
    """An operator requeues a failed job of a team now at its enforced monthly budget: the refusal is
    shown to the operator, no copy is created and nothing is audited."""
    Team.objects.filter(id=team.id).update(monthly_budget_gpu_hours=Decimal("0.5"), budget_enforced=True)
    job = JobFactory(team=team, state=State.ENDED, end_reason=EndReason.FAILED, gpus=1, hours=1.0)

    response = operator_client.post(job_action(job, "requeue"), {"confirm": "yes"}, follow=True)

    assert response.status_code == 200 and "cannot be requeued" in _said(response)
    assert "request.hours" not in _said(response)  # the operator's words, not the declaration's field path
    assert Job.objects.count() == 1 and not AuditEntry.objects.exists()


def test_requeue_refused_by_intake_leaves_a_waiting_job_waiting(operator, team, now):
    """An operator requeues a queued job the team's enforced budget no longer admits: the refusal
    undoes the cancel, so the job still waits as it did."""
    Team.objects.filter(id=team.id).update(monthly_budget_gpu_hours=Decimal("0.5"), budget_enforced=True)
    job = JobFactory(team=team, state=State.QUEUED, gpus=1, hours=1.0)
    with pytest.raises(services.RequeueRefused):
        services.requeue_job(job_id=job.id, actor=operator, now=now)
    job.refresh_from_db()
    assert (job.state, job.cancel_requested_at) == (State.QUEUED, None)


def test_requeue_of_a_waiting_pipeline_job_keeps_it_waiting_for_its_prerequisite(operator_client, team):
    """An operator requeues job B, queued and waiting (after_ok) for job A, which has not run yet: the
    copy waits for A as B did."""
    upstream = JobFactory(team=team, state=State.QUEUED)
    job = JobFactory(team=team, state=State.QUEUED)
    Dependency.objects.create(job=job, prerequisite=upstream, kind=Dependency.AFTER_OK)

    response = operator_client.post(job_action(job, "requeue"), {"confirm": "yes"})

    assert response.status_code == 302
    copy = Job.objects.exclude(id__in=[upstream.id, job.id]).get()
    assert list(copy.prerequisites.values_list("prerequisite_id", "kind")) == [
        (upstream.id, Dependency.AFTER_OK)
    ], "the requeued copy no longer waits for its prerequisite"


def test_requeue_of_a_waiting_prerequisite_leaves_its_dependents_waiting_for_the_copy(
    operator, team, pool, now
):
    """An operator requeues job A, queued, to stage it afresh; B waits for A to succeed, C for it to end.
    The copy replaces A: the next pass ends neither, both wait for the copy, and each is told so."""
    prepare = JobFactory(team=team, state=State.QUEUED)
    train, report = JobFactory(team=team, state=State.SUBMITTED), JobFactory(team=team, state=State.SUBMITTED)
    Dependency.objects.create(job=train, prerequisite=prepare, kind=Dependency.AFTER_OK)
    Dependency.objects.create(job=report, prerequisite=prepare, kind=Dependency.AFTER_ANY)

    copy = services.requeue_job(job_id=prepare.id, actor=operator, now=now)
    scheduler.run_pass(now=now)

    waits = dict(Job.objects.filter(id__in=[train.id, report.id]).values_list("id", "pending_reason"))
    assert waits[train.id].startswith(f"waiting for job {copy.id} to succeed"), "B ended, or waits for A"
    assert waits[report.id].startswith(f"waiting for job {copy.id} to end"), (
        "C ended, or runs before the copy"
    )
    told = train.events.filter(to_state=State.SUBMITTED, from_state=State.SUBMITTED).get().reason
    assert (
        told
        == f"job {prepare.id} was requeued as job {copy.id} by olga: this job waits for job {copy.id} now"
    )
    entry = AuditEntry.objects.get(action="job.requeue")
    assert entry.after["dependents_wait_for_copy"] == [train.id, report.id]


def test_a_dependent_ends_on_how_the_copy_of_its_requeued_prerequisite_ended(operator, team, pool, now):
    """The copy requeued again while it waits is replaced in turn; when the last copy fails, the dependent
    ends dependency_failed naming that copy."""
    prepare = JobFactory(team=team, state=State.QUEUED)
    train = JobFactory(team=team, state=State.SUBMITTED)
    Dependency.objects.create(job=train, prerequisite=prepare, kind=Dependency.AFTER_OK)
    first = services.requeue_job(job_id=prepare.id, actor=operator, now=now)
    second = services.requeue_job(job_id=first.id, actor=operator, now=now + timedelta(minutes=1))
    Job.objects.filter(id=second.id).update(state=State.ENDED, end_reason=EndReason.STAGING_FAILED)

    scheduler.run_pass(now=now + timedelta(minutes=2))

    train.refresh_from_db()
    assert (train.state, train.end_reason) == (State.ENDED, EndReason.DEPENDENCY_FAILED)
    assert train.end_detail == f"job {second.id} ended staging_failed; this job ran only after it succeeded"


def test_a_teams_own_cancel_of_a_prerequisite_still_ends_its_dependents_though_it_is_re_run(team, pool, now):
    """Only an operator's requeue replaces a job: a team that cancels a step, then re-runs it, has ended the
    pipeline, whether or not a pass ran in between."""
    prepare = JobFactory(team=team, state=State.QUEUED)
    train = JobFactory(team=team, state=State.SUBMITTED)
    Dependency.objects.create(job=train, prerequisite=prepare, kind=Dependency.AFTER_OK)
    jobs_services.cancel_job(job_id=prepare.id, user=None, now=now)
    JobFactory(team=team, state=State.SUBMITTED, rerun_of=prepare, submitted_at=now + timedelta(seconds=5))

    scheduler.run_pass(now=now + timedelta(seconds=6))

    train.refresh_from_db()
    assert (train.state, train.end_reason) == (State.ENDED, EndReason.DEPENDENCY_FAILED)


def test_requeue_posted_twice_leaves_one_waiting_copy(operator_client, team):
    """An operator's requeue of a waiting job is posted twice (a double click, or two operators): the
    second is refused, naming the copy still alive, so exactly one copy waits, linked to its source."""
    job = JobFactory(team=team, state=State.QUEUED)

    operator_client.post(job_action(job, "requeue"), {"confirm": "yes"})
    second = operator_client.post(job_action(job, "requeue"), {"confirm": "yes"}, follow=True)

    copy = Job.objects.exclude(id=job.id).get()
    assert copy.rerun_of_id == job.id and copy.state == State.SUBMITTED
    assert f"already requeued as job #{copy.id}" in _said(second)
    assert AuditEntry.objects.filter(action="job.requeue").count() == 1


def test_the_jobs_list_offers_actions_by_state_and_polls_itself(operator_client, team, pool, now):
    waiting = JobFactory(team=team, state=State.QUEUED)
    running = running_job(team=team, node=pool[0], now=now)
    fragment = operator_client.get(JOBS, **HTMX).content.decode()
    assert fragment.lstrip().startswith('<section id="op-job-rows"')
    assert job_action(waiting, "cancel") in fragment and job_action(waiting, "requeue") in fragment
    assert job_action(running, "cancel") in fragment and job_action(running, "requeue") not in fragment
    assert "gpu-01" in fragment  # the node it runs on


def test_the_teams_page_lists_members_share_budget_and_use(
    operator_client, team, other_team, member, pool, now
):
    team.monthly_budget_gpu_hours = 500
    team.save()
    running_job(team=team, node=pool[0], gpus=3, now=now)
    page = operator_client.get(reverse("operations:teams")).content.decode()
    assert "vision" in page and "audio" in page and "500 GPU-h" in page and "3 GPUs" in page
    detail = operator_client.get(reverse("operations:team", args=["vision"])).content.decode()
    assert "alice" in detail and reverse("metering:budget", args=["vision"]) in detail
    assert "3 GPUs held now" in detail


def test_an_operator_sets_a_teams_share_and_it_is_audited(operator_client, team):
    response = operator_client.post(reverse("operations:team", args=["vision"]), {"share": "2.5"})
    assert response.status_code == 302
    team.refresh_from_db()
    assert team.share == 2.5
    entry = AuditEntry.objects.get(action="team.share")
    assert (entry.target, entry.before, entry.after) == ("team:vision", {"share": 1.0}, {"share": 2.5})
    assert "2.5" in operator_client.get(reverse("operations:team", args=["vision"])).content.decode()


def test_teams_are_offline_until_an_operator_allows_egress_and_it_is_audited(
    operator_client, team, member_client
):
    assert not team.egress_allowed
    page = operator_client.get(reverse("operations:team", args=["vision"])).content.decode()
    assert "Offline:" in page and "Allow internet egress" in page
    member_client.post(
        reverse("operations:team", args=["vision"]), {"egress": "allow"}
    )  # 404: not an operator
    team.refresh_from_db()
    assert not team.egress_allowed
    assert (
        operator_client.post(reverse("operations:team", args=["vision"]), {"egress": "allow"}).status_code
        == 302
    )
    team.refresh_from_db()
    assert team.egress_allowed
    entry = AuditEntry.objects.get(action="team.egress")
    assert (entry.before, entry.after) == ({"egress_allowed": False}, {"egress_allowed": True})
    assert (
        "Egress allowed:" in operator_client.get(reverse("operations:team", args=["vision"])).content.decode()
    )
    operator_client.post(reverse("operations:team", args=["vision"]), {"egress": "deny"})
    team.refresh_from_db()
    assert not team.egress_allowed


@pytest.mark.parametrize("share", ["0", "-1", "abc", "inf", "nan", "5000"])
def test_a_share_that_is_not_a_positive_number_is_refused(operator_client, team, share):
    response = operator_client.post(reverse("operations:team", args=["vision"]), {"share": share})
    assert response.status_code == 422 and "a share is a number above 0" in response.content.decode()
    team.refresh_from_db()
    assert team.share == 1.0 and not AuditEntry.objects.exists()


def test_a_team_member_who_is_also_staff_sees_every_team(team, other_team, client):
    staff_member = MembershipFactory(team=team, user=UserFactory(username="sam", is_staff=True)).user
    client.force_login(staff_member)
    assert client.get(reverse("operations:team", args=["audio"])).status_code == 200


def test_the_requeue_page_warns_that_the_copy_runs_as_the_operator_and_names_a_submitter_gone(
    operator_client, team, member
):
    """A requeue runs the declaration as the operator, with the team's secrets and budget: the page said nothing of
    it, even where the job's submitter had since been removed from the team and nobody there vouches for the code."""
    ended = {"state": State.RELEASED, "end_reason": EndReason.FAILED}
    kept = JobFactory(team=team, submitted_by=member, secrets=["HF_TOKEN"], **ended)
    page = operator_client.get(job_action(kept, "requeue")).content.decode()
    assert "submitted as you" in page and "HF_TOKEN" in page
    assert "may no longer act for the team" not in page
    mallory = UserFactory(username="mallory")
    gone = JobFactory(team=team, submitted_by=mallory, **ended)  # never a member, as one removed since
    page = operator_client.get(job_action(gone, "requeue")).content.decode()
    assert "mallory is no longer a member of team vision" in page and "may no longer act for the team" in page


@pytest.mark.parametrize("page", ["operations:jobs", "operations:queue", "operations:audit"])
def test_operator_lists_count_no_further_than_the_cap(operator_client, team, monkeypatch, page, now):
    """The operators' jobs, queue and audit lists refresh every 5 s: with an exact COUNT(*) each refresh read
    every matching row (313-350 ms at 400,000 jobs; 760 ms for a deep page). Their count stops at the cap, as
    the members' lists do, and the page says there is more than it counted."""
    monkeypatch.setattr(paging, "COUNT_CAP", 3)
    for i in range(5):
        JobFactory(team=team, state=State.QUEUED)
        services.audit.record(
            actor="olga", action="node.drain", target=f"node:gpu-{i}", before={}, after={}, now=now
        )
    response = operator_client.get(reverse(page))
    assert response.context["page"].paginator.count == 3
    if page != "operations:audit":  # the audit page shows no count: one page of 50 holds these five
        assert "3+ jobs" in response.content.decode()
