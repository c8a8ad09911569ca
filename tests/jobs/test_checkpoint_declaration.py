"""Pausable jobs: ``request.checkpoint`` is declared through every channel, bounded, and makes a job preemptible."""

import pytest

from jobs.models import Job
from tests.jobs.intake_channels import error_fields, submit_api, submit_file, submit_form

pytestmark = pytest.mark.django_db


@pytest.fixture
def good(roots):
    _, out_root = roots
    return {
        "name": "pausable",
        "work": {"argv": ["python3", "train.py"]},
        "request": {
            "gpus": 1,
            "hours": 1.0,
            "checkpoint": {"signal": "USR1", "grace_s": 30, "bytes": "2 GB"},
        },
        "output": {"uri": f"file://{out_root}/pausable", "bytes": 1000},
    }


def _submit(channel, good, client, token):
    return {
        "form": lambda: submit_form(client, good),
        "file": lambda: submit_file(client, good),
        "api": lambda: submit_api(client, good, token),
    }[channel]()


@pytest.mark.parametrize("channel", ["form", "file", "api"])
def test_a_checkpoint_is_stored_through_every_channel_and_makes_the_job_preemptible(
    channel, good, pool, member_client, member_token
):
    response = _submit(channel, good, member_client, member_token)
    assert response.status_code in (201, 302), response.content[:500]
    job = Job.objects.get()
    assert (job.checkpoint_signal, job.checkpoint_grace_s, job.checkpoint_bytes) == ("USR1", 30, 2 * 10**9)
    assert job.preemptible and job.checkpoints


def test_a_checkpoint_with_only_its_signal_takes_the_default_grace_and_bytes(
    good, pool, member_client, member_token
):
    good["request"]["checkpoint"] = {"signal": "SIGUSR2"}
    assert submit_api(member_client, good, member_token).status_code == 201
    job = Job.objects.get()
    assert (job.checkpoint_signal, job.checkpoint_grace_s, job.checkpoint_bytes) == ("USR2", 120, 2**30)


def test_a_job_without_a_checkpoint_declares_none(good, pool, member_client, member_token):
    del good["request"]["checkpoint"]
    assert submit_api(member_client, good, member_token).status_code == 201
    job = Job.objects.get()
    assert (job.checkpoint_signal, job.checkpoint_grace_s, job.checkpoint_bytes, job.preemptible) == (
        "",
        None,
        None,
        False,
    )


@pytest.mark.parametrize(
    ("checkpoint", "path"),
    [
        ({"signal": "KILL"}, "request.checkpoint.signal"),  # not one a job can catch: only a safe few
        ({"signal": "STOP"}, "request.checkpoint.signal"),
        ({"signal": 10}, "request.checkpoint.signal"),
        ({"grace_s": 30}, "request.checkpoint.signal"),
        ({"signal": "USR1", "grace_s": 0}, "request.checkpoint.grace_s"),
        ({"signal": "USR1", "grace_s": 3601}, "request.checkpoint.grace_s"),
        ({"signal": "USR1", "grace_s": True}, "request.checkpoint.grace_s"),
        ({"signal": "USR1", "bytes": "lots"}, "request.checkpoint.bytes"),
        ({"signal": "USR1", "bytes": 0}, "request.checkpoint.bytes"),
        ({"signal": "USR1", "bytes": "2 PB"}, "request.checkpoint.bytes"),
        ({"signal": "USR1", "every": 5}, "request.checkpoint"),
        ("USR1", "request.checkpoint"),
    ],
)
def test_a_checkpoint_outside_its_rules_is_refused(checkpoint, path, good, pool, member_client, member_token):
    good["request"]["checkpoint"] = checkpoint
    response = submit_api(member_client, good, member_token)
    assert response.status_code == 422 and path in error_fields(response), response.content[:500]
    assert not Job.objects.exists()


@pytest.mark.parametrize("channel", ["form", "file"])
def test_the_form_and_the_file_name_a_bad_grace_beside_its_field(
    channel, good, pool, member_client, member_token
):
    good["request"]["checkpoint"]["grace_s"] = 7200
    response = _submit(channel, good, member_client, member_token)
    assert response.status_code == 422 and "request.checkpoint.grace_s" in error_fields(response)


def test_the_api_shows_the_checkpoint(good, pool, member_client, member_token):
    job_id = submit_api(member_client, good, member_token).json()["id"]
    shown = member_client.get(f"/api/v1/jobs/{job_id}", HTTP_AUTHORIZATION=f"Bearer {member_token}").json()
    assert shown["request"]["checkpoint"] == {"signal": "USR1", "grace_s": 30, "bytes": 2 * 10**9}
    assert shown["request"]["preemptible"] is True
