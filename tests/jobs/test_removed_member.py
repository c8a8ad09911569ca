"""A member removed from a team, or an account deactivated, starts none of its waiting jobs with the team's secrets.

Removing a member cancels its jobs in that team that hold no GPUs yet, in the removal's own transaction; a job that
starts all the same (placed while the removal committed, or its submitter deactivated) gets none of the team's
secrets: its attempt ends released, with the reason, its GPUs free.
"""

import contextlib
import threading
from collections.abc import Iterator

import pytest
from cryptography.fernet import Fernet
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone

from accounts import members, team_secrets
from jobs import agent, attempt_space, rental, sandbox
from jobs.lifecycle import EndReason, State
from jobs.models import GpuHold, Job
from tests.factories import JobFactory, MembershipFactory, NodeFactory, UserFactory

pytestmark = pytest.mark.django_db
REFUSED = "not started, handed none of the team's secrets"


@pytest.fixture(autouse=True)
def secrets_key(settings):
    settings.E31_SECRETS_KEYS = [Fernet.generate_key().decode()]


@pytest.fixture
def mallory(team):
    return MembershipFactory(team=team, user=UserFactory(username="mallory")).user


def _remove(team, user, admin) -> None:
    assert members.remove_member(team=team, user_id=user.id, actor=admin, now=timezone.now())


@contextlib.contextmanager
def _row_held(job: Job, *, for_s: float) -> Iterator[None]:
    """Another transaction (the scheduler placing the job, say) holds the job's row for ``for_s`` seconds, or until
    the block ends, whichever comes first."""
    held, done = threading.Event(), threading.Event()

    def hold_the_row():
        try:
            with transaction.atomic():
                Job.objects.select_for_update().filter(id=job.id).get()
                held.set()
                done.wait(timeout=for_s)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    try:
        assert held.wait(timeout=5)
        yield
    finally:
        done.set()
        holder.join()


def _states(*jobs) -> list[tuple[str, str]]:
    for job in jobs:
        job.refresh_from_db()
    return [(job.state, job.end_reason) for job in jobs]


# --- Removal cancels the member's jobs that hold no GPUs yet ----------------------------------------------------


def test_removing_a_member_cancels_its_jobs_in_the_team_that_have_not_started(team, team_admin, mallory):
    waiting = [
        JobFactory(team=team, submitted_by=mallory, state=s) for s in ("submitted", "staging", "queued")
    ]
    _remove(team, mallory, team_admin)
    assert _states(*waiting) == [(State.ENDED, EndReason.CANCELLED)] * 3
    for job in waiting:
        assert job.end_detail == "mallory was removed from team vision"
        assert job.pending_reason == ""


def test_removal_leaves_other_teams_jobs_other_members_jobs_and_running_jobs(
    team, other_team, team_admin, member, mallory
):
    MembershipFactory(team=other_team, user=mallory)
    elsewhere = JobFactory(team=other_team, submitted_by=mallory, state="queued")
    colleagues = JobFactory(team=team, submitted_by=member, state="queued")
    running = JobFactory(team=team, submitted_by=mallory, state="running", attempt=1)
    _remove(team, mallory, team_admin)
    assert _states(elsewhere, colleagues, running) == [("queued", ""), ("queued", ""), ("running", "")]


def test_the_reason_a_removed_members_job_was_cancelled_is_on_its_page_and_in_the_api(
    client, team, team_admin, mallory
):
    job = JobFactory(team=team, submitted_by=mallory, state="queued")
    client.force_login(team_admin)
    assert client.post(reverse("accounts:member-remove", args=["vision", mallory.id])).status_code == 302
    shown = client.get(f"/api/v1/jobs/{job.id}").json()
    assert (shown["state"], shown["end_reason"]) == ("ended", "cancelled")
    assert shown["end_detail"] == "mallory was removed from team vision"
    assert shown["events"][-1]["reason"] == "cancelled by adele: mallory was removed from team vision"
    page = client.get(reverse("jobs:detail", args=[job.id])).content.decode()
    assert "mallory was removed from team vision" in page


@pytest.mark.django_db(transaction=True)
def test_a_removal_does_not_wait_for_a_job_being_placed_at_that_moment(team, team_admin, mallory):
    """The removal holds the team's row, and a transaction holding the job's row may wait for that row in turn (a row
    it inserts refers to the team): the job is skipped, for the start's check to end, never a deadlock."""
    placing, job = JobFactory(team=team, submitted_by=mallory), JobFactory(team=team, submitted_by=mallory)
    with _row_held(placing, for_s=10):
        _remove(team, mallory, team_admin)
    assert _states(placing, job) == [("queued", ""), (State.ENDED, EndReason.CANCELLED)]


def test_a_removal_refused_cancels_nothing(team, team_admin):
    """The team's only admin cannot be removed: its jobs stay queued, the transaction being one."""
    job = JobFactory(team=team, submitted_by=team_admin, state="queued")
    with pytest.raises(members.MembershipRefused):
        members.remove_member(team=team, user_id=team_admin.id, actor=team_admin, now=timezone.now())
    assert _states(job) == [("queued", "")]


def test_deleting_an_account_cancels_its_jobs_that_have_not_started(team, mallory):
    """Deleted, its jobs would keep no submitter, like a job the platform made itself, and start with secrets."""
    job = JobFactory(team=team, submitted_by=mallory, state="queued")
    mallory.delete()
    assert _states(job) == [(State.ENDED, EndReason.CANCELLED)]
    assert job.end_detail == "the account mallory was deleted"


def test_deleting_an_account_stops_its_running_jobs_which_never_start_again(team, mallory):
    """Reproduction: a deleted account's running job, requeued when its node was lost, started again with no
    submitter, which the start's check lets through as a job the platform made, and got the team's secrets."""
    node = NodeFactory(name="gpu-01")
    job = JobFactory(team=team, submitted_by=mallory, secrets=["HF_TOKEN"], requeue=True)
    assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: (0,)}, now=timezone.now())
    assert rental.start_allocation(allocation_id=job.allocations.get().id, now=timezone.now())
    mallory.delete()
    job.refresh_from_db()
    assert job.cancel_requested_at is not None  # its agent stops the process and releases the GPUs
    rental.lose_node_allocations(node=node, now=timezone.now(), detail="the node stopped answering")
    job.refresh_from_db()
    assert (job.state, job.end_reason) == (State.RELEASED, EndReason.CANCELLED)


def test_deleting_an_account_marks_its_job_sealing_outputs_so_it_never_runs_again(team, mallory):
    """A job in OUTPUT (its process ended, its outputs being sealed) is not offered a cancel; but the account's
    deletion must still mark it, or a node lost before the seal requeues it with no submitter, secrets and all."""
    node = NodeFactory(name="gpu-01")
    job = JobFactory(team=team, submitted_by=mallory, secrets=["HF_TOKEN"], requeue=True)
    assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: (0,)}, now=timezone.now())
    part = job.allocations.get()
    assert rental.start_allocation(allocation_id=part.id, now=timezone.now())
    assert rental.finish_allocation(
        allocation_id=part.id, exit_code=0, outcome=EndReason.SUCCEEDED, now=timezone.now()
    )
    mallory.delete()
    job.refresh_from_db()
    assert job.state == State.OUTPUT and job.cancel_requested_at is not None
    rental.lose_node_allocations(node=node, now=timezone.now(), detail="the node stopped answering")
    job.refresh_from_db()
    assert (job.state, job.end_reason) == (State.RELEASED, EndReason.CANCELLED)


@pytest.mark.django_db(transaction=True)
def test_deleting_an_account_waits_for_a_job_row_held_at_that_moment_and_cancels_it_too(team, mallory):
    """A deletion that skipped a job row held elsewhere (the scheduler placing it) left that job live, and its
    submitter then set NULL: it started later as a job the platform made. The deletion's own NULL-setting waits
    for that row anyway, so the cancel waits for it too."""
    held_job = JobFactory(team=team, submitted_by=mallory, state="queued")
    with _row_held(held_job, for_s=0.5):  # the placing transaction commits half a second later
        mallory.delete()
    assert _states(held_job) == [(State.ENDED, EndReason.CANCELLED)]


# --- At start: no secrets for a submitter who may no longer act for the team --------------------------------------


@pytest.fixture
def node(settings, tmp_path):
    settings.E31_AGENT_ROOT = tmp_path / "agents"
    try:
        yield NodeFactory(name="gpu-01", limits="memory, cpu, pids; disk bounded")
    finally:  # an attempt that ran keeps its space mounted for its outputs, until the retention sweep
        attempt_space.release_all(settings.E31_AGENT_ROOT)


@pytest.fixture
def handed(monkeypatch):
    """The secrets each attempt that ran was handed."""
    seen = []
    confined_run = agent._confined_run

    def watched(part, dirs, mode, uid, secrets, **hooks):
        seen.append(secrets)
        return confined_run(part, dirs, mode, uid, secrets, **hooks)

    monkeypatch.setattr(agent, "_confined_run", watched)
    return seen


def _rented_job(team, node, submitted_by):
    team_secrets.set_secret(team=team, name="HF_TOKEN", value="ROTATED", user=None, now=timezone.now())
    job = JobFactory(team=team, submitted_by=submitted_by, secrets=["HF_TOKEN"])
    assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: (0,)}, now=timezone.now())
    return job


def _run(job) -> Job:
    agent.run_part(allocation_id=job.allocations.get().id, mode=sandbox.UNSANDBOXED, uids=None)
    job.refresh_from_db()
    return job


def test_a_job_placed_while_its_submitter_was_removed_starts_without_the_secrets(
    team, team_admin, mallory, node, handed
):
    job = _rented_job(team, node, mallory)
    _remove(team, mallory, team_admin)  # rented already: a removal racing the placement
    _run(job)
    assert handed == []
    assert (job.state, job.end_reason) == ("released", "failed")
    assert job.end_detail == f"{REFUSED}: mallory is no longer a member of team vision"
    assert not GpuHold.objects.filter(active=True).exists()


def test_a_deactivated_submitters_job_starts_without_the_secrets(team, mallory, node, handed):
    job = _rented_job(team, node, mallory)
    mallory.is_active = False
    mallory.save()
    _run(job)
    assert handed == []
    assert (job.state, job.end_reason) == ("released", "failed")
    assert job.end_detail == f"{REFUSED}: the account mallory is deactivated"
    assert not GpuHold.objects.filter(active=True).exists()


def test_a_members_job_gets_its_secrets(team, mallory, node, handed):
    assert _run(_rented_job(team, node, mallory)).end_reason == "succeeded"
    assert handed == [{"HF_TOKEN": "ROTATED"}]


def test_an_operators_job_for_a_team_gets_its_secrets(team, operator, node, handed):
    """An operator re-runs a team's job as themselves (operations): not a member, but acting for the team."""
    assert _run(_rented_job(team, node, operator)).end_reason == "succeeded"
    assert handed == [{"HF_TOKEN": "ROTATED"}]


def test_a_job_with_no_submitter_gets_its_secrets(team, node, handed):
    assert _run(_rented_job(team, node, None)).end_reason == "succeeded"
    assert handed == [{"HF_TOKEN": "ROTATED"}]
