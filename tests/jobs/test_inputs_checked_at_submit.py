"""A file:// input under the team's own folder is checked when the job is submitted: a missing file
or one whose size differs from the declaration is refused then, with the reason, not after staging.
An input a prerequisite job will write is checked when it stages."""

import pytest

from jobs.models import Job
from tests.jobs.intake_channels import submit_api, submit_file, submit_form

pytestmark = pytest.mark.django_db
CHANNELS = ["form", "file", "api"]


def _job(data_uri: str, size: int, **extra) -> dict:
    return {
        "name": "reads", "work": {"argv": ["/usr/bin/true"]},
        "data": [{"name": "corpus", "uri": data_uri, "bytes": size}],
        "request": {"gpus": 1, "hours": 1.0}, "output": {"bytes": 10}, **extra,
    }  # fmt: skip


def _send(channel, member_client, member_token, raw):
    if channel == "api":
        return submit_api(member_client, raw, member_token)
    return {"form": submit_form, "file": submit_file}[channel](member_client, raw)


def _errors(response) -> dict[str, str]:
    if response["Content-Type"].startswith("application/json"):
        return {e["field"]: e["message"] for e in response.json()["errors"]}
    return dict(response.context["form"].errors)


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_missing_file_is_refused_at_submit(channel, roots, pool, member_client, member_token):
    data, _ = roots
    response = _send(channel, member_client, member_token, _job(f"file://{data}/nope.tar", 10))
    assert response.status_code == 422
    assert "no such file" in _errors(response)["data[0].uri"]
    assert not Job.objects.exists()


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_file_of_another_size_is_refused_at_submit_naming_both_sizes(
    channel, roots, pool, member_client, member_token
):
    data, _ = roots
    (data / "corpus.tar").write_bytes(b"x" * 12)
    response = _send(channel, member_client, member_token, _job(f"file://{data}/corpus.tar", 10))
    assert response.status_code == 422
    message = _errors(response)["data[0].bytes"]
    assert "12 bytes" in message and "10" in message
    assert not Job.objects.exists()


def test_a_file_of_the_declared_size_is_accepted(roots, pool, member_client, member_token):
    data, _ = roots
    (data / "corpus.tar").write_bytes(b"x" * 10)
    response = submit_api(member_client, _job(f"file://{data}/corpus.tar", 10), member_token)
    assert response.status_code == 201, response.content[:400]


def test_an_input_a_prerequisite_will_write_is_left_to_staging(
    roots, pool, team, member_client, member_token
):
    data, _ = roots
    first = submit_api(member_client, _job(f"file://{data}/corpus.tar", 0), member_token)
    assert first.status_code == 422  # nothing there yet, and no prerequisite named
    (data / "seed.bin").write_bytes(b"s")
    writer = submit_api(member_client, _job(f"file://{data}/seed.bin", 1), member_token).json()["id"]
    later = _job(f"file://{data}/corpus.tar", 10, after_ok=[writer])
    assert submit_api(member_client, later, member_token).status_code == 201
