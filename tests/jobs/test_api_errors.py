"""The API answers in its own words: what was asked, what is wrong with a token, null as absent."""

import json

import pytest
from django.test import Client

from accounts import services as accounts
from jobs.models import Job

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(member_token) -> Client:
    return Client(headers={"Authorization": f"Bearer {member_token}"})


def test_the_ledger_without_dates_says_which_parameters_it_needs(api):
    response = api.get("/api/v1/ledger")
    body = response.json()
    assert response.status_code == 422
    assert "job" not in body["detail"].lower()
    assert "start" in body["detail"] and "end" in body["detail"]
    assert {e["field"] for e in body["errors"]} == {"start", "end"}


def test_a_job_body_that_is_not_valid_still_names_the_job(api):
    response = api.post("/api/v1/jobs", data="{}", content_type="application/json")
    assert response.status_code == 422 and response.json()["detail"] == "The job is not valid."


@pytest.mark.parametrize(
    ("header", "says"),
    [
        (None, "send a bearer token"),
        ("Token abc", "not a bearer token"),
        ("Bearer ", "empty"),
        ("Bearer nonsense", "does not look like an e31 token"),
        ("Bearer e31_unknown-token-value", "not known"),
    ],
)
def test_a_refused_token_says_what_is_wrong_with_it(client, header, says):
    headers = {"Authorization": header} if header is not None else {}
    response = client.get("/api/v1/jobs", headers=headers)
    assert response.status_code == 401
    assert says in response.json()["detail"].lower()


def test_a_revoked_token_says_it_was_revoked(client, member):
    row, token = accounts.create_api_token(user=member, label="old laptop")
    from django.utils import timezone

    accounts.revoke_api_token(token_id=row.id, user=member, now=timezone.now())
    response = client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401
    assert "revoked" in response.json()["detail"].lower()


def test_a_token_of_a_deactivated_user_says_so(client, member):
    _, token = accounts.create_api_token(user=member, label="x")
    member.is_active = False
    member.save()
    response = client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401 and "deactivated" in response.json()["detail"].lower()


def test_explicit_null_for_optional_fields_is_taken_as_absent(api, roots, pool):
    data_root, out_root = roots
    (data_root / "corpus.bin").write_bytes(b"x" * 64)
    body = {
        "name": "nulls",
        "team": None,
        "work": {"argv": ["python3", "-c", "print(1)"], "image": None, "workdir": None, "env": None},
        "data": [{"name": "corpus", "uri": f"file://{data_root}/corpus.bin", "bytes": 64, "sha256": None}],
        "request": {
            "gpus": 1, "hours": 0.5, "min_gpus": None, "gpu_model": None, "preemptible": None,
            "requeue": None, "memory": None, "cpus": None,
        },
        "output": {"uri": f"file://{out_root}/nulls", "bytes": 100},
    }  # fmt: skip
    response = api.post("/api/v1/jobs", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 201, response.content[:500]
    job = Job.objects.get()
    assert (job.image, job.min_gpus, job.preemptible) == ("", None, False)
    assert job.inputs.get().sha256 == ""


def test_null_for_a_required_field_is_still_refused_naming_it(api, roots, pool):
    body = {
        "name": "x",
        "work": {"argv": ["a"]},
        "request": {"gpus": None, "hours": 1},
        "output": {"bytes": 1},
    }
    response = api.post("/api/v1/jobs", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 422
    assert "request.gpus" in {e["field"] for e in response.json()["errors"]}
