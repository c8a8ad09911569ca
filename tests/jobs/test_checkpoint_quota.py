"""A team's pausable jobs together claim at most E31_TEAM_CHECKPOINT_BYTES of checkpoint space.

Found by trying it: a pausable job's checkpoint is a filesystem image of its declared size, allocated on
the checkpoint store at its first start and kept until the job ends, up to E31_MAX_CHECKPOINT_BYTES (1 TiB)
a job, and nothing counted a team's jobs together: a 900 MB declaration took a 1 GiB disk and another
team's attempt was refused there. Like a storage quota on claims, every job not yet ended counts what it
declared (whether its image is made yet or not), and a submission past the team's quota is refused
beside the field, saying what the team's jobs already claim.
"""

import pytest

from jobs.models import Job
from tests.factories import JobFactory
from tests.jobs.intake_channels import error_fields, submit_api, submit_form

pytestmark = pytest.mark.django_db

GB = 10**9


@pytest.fixture(autouse=True)
def quota(settings):
    settings.E31_TEAM_CHECKPOINT_BYTES = 5 * GB


@pytest.fixture
def pausable(roots):
    _, out_root = roots
    return {
        "name": "pausable",
        "work": {"argv": ["python3", "train.py"]},
        "request": {"gpus": 1, "hours": 1.0, "checkpoint": {"signal": "USR1", "bytes": "2 GB"}},
        "output": {"uri": f"file://{out_root}/pausable", "bytes": 1000},
    }


def _claimed(team, *, state: str, gb: int) -> Job:
    return JobFactory(team=team, state=state, checkpoint_signal="USR1", checkpoint_grace_s=30,
                      checkpoint_bytes=gb * GB, preemptible=True)  # fmt: skip


def test_a_submission_past_the_teams_checkpoint_quota_is_refused_saying_what_is_claimed(
    team, pausable, pool, member_client, member_token
):
    _claimed(team, state="queued", gb=2)  # not started yet: its claim counts all the same
    _claimed(team, state="output", gb=2)
    response = submit_api(member_client, pausable, member_token)
    assert response.status_code == 422 and "request.checkpoint.bytes" in error_fields(response)
    message = response.json()["errors"][0]["message"]
    assert "4.0 GB" in message and "2.0 GB" in message and "5.0 GB" in message
    assert "E31_TEAM_CHECKPOINT_BYTES" in message
    assert Job.objects.count() == 2


def test_the_form_names_the_quota_beside_the_checkpoint_field(team, pausable, pool, member_client):
    _claimed(team, state="running", gb=4)
    response = submit_form(member_client, pausable)
    assert response.status_code == 422 and "request.checkpoint.bytes" in error_fields(response)


def test_an_ended_jobs_claim_comes_back_and_jobs_without_a_checkpoint_are_never_counted(
    team, pausable, pool, member_client, member_token
):
    _claimed(team, state="released", gb=4)
    _claimed(team, state="ended", gb=4)
    assert submit_api(member_client, pausable, member_token).status_code == 201
    del pausable["request"]["checkpoint"]
    for _ in range(3):
        assert submit_api(member_client, pausable, member_token).status_code == 201


def test_another_teams_claims_do_not_count_against_this_one(
    team, other_team, pausable, pool, member_client, member_token
):
    _claimed(other_team, state="running", gb=5)
    assert submit_api(member_client, pausable, member_token).status_code == 201


def test_an_array_claims_its_checkpoint_once_a_task(team, pausable, pool, member_client, member_token):
    pausable["array"] = "0-2"  # three tasks of 2 GB: past 5 GB
    response = submit_api(member_client, pausable, member_token)
    assert response.status_code == 422 and "request.checkpoint.bytes" in error_fields(response)
    assert "3 tasks" in response.json()["errors"][0]["message"]
    pausable["array"] = "0-1"
    assert submit_api(member_client, pausable, member_token).status_code == 201
    assert Job.objects.count() == 2
