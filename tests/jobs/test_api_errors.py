"""The API answers in its own words: what was asked, what is wrong with a token, null as absent."""

import json

import pytest
from django.test import Client
from django.urls import reverse

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


@pytest.mark.parametrize(
    ("work", "field"),
    [
        ({"argv": ["python3", "\ud800"]}, "work.argv[1]"),
        ({"argv": ["python3"], "env": {"LR": "\ud800"}}, "work.env.LR"),
    ],
    ids=["argv", "env-value"],
)
def test_a_lone_surrogate_in_argv_or_env_is_refused_naming_the_field(api, roots, pool, work, field):
    """A script sends an argument or an env value holding the JSON escape "\\ud800", a lone surrogate that
    json.loads accepts but no UTF-8 can hold: the job is a 422 naming the field, never a row PostgreSQL refuses."""
    body = {
        "name": "sweep",
        "work": work,
        "request": {"gpus": 1, "hours": 1.0},
        "output": {"uri": f"file://{roots[1]}/sweep", "bytes": 1000},
    }
    response = api.post("/api/v1/jobs", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 422, response.content[:300]
    assert [error["field"] for error in response.json()["errors"]] == [field]
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("path", "content_type"), [("/api/v1/jobs", "application/json"), ("/api/v1/jobs/file", "text/plain")]
)
def test_a_body_past_the_upload_limit_is_a_413_in_the_apis_own_shape(api, settings, path, content_type):
    """A script sends a job larger than DATA_UPLOAD_MAX_MEMORY_SIZE: the answer is a JSON 413 that says the
    limit, as the schema documents it, never Django's HTML "Bad Request" page."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100_000
    padded = json.dumps({"name": "x", "work": {"argv": ["true"], "env": {"PAD": "a" * 200_000}}})
    response = api.post(path, data=padded, content_type=content_type)
    assert response.status_code == 413 and response["Content-Type"].startswith("application/json")
    assert "100.0 KB" in response.json()["detail"]
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("method", "path"),
    [("put", "/api/v1/teams/vision/secrets/HF_TOKEN"), ("put", "/api/v1/notifications/email/vision")],
)
def test_a_bad_body_that_is_not_a_job_is_named_as_the_request_body(client, team_admin, method, path):
    """A team admin's script sends a number where a secret's value or an e-mail choice goes: the 422 says the
    request body is not valid and which field, never that a job is."""
    _, token = accounts.create_api_token(user=team_admin, label="ci")
    body = json.dumps({"value": 1, "email": 1})
    response = getattr(client, method)(
        path, data=body, content_type="application/json", headers={"Authorization": f"Bearer {token}"}
    )
    detail = response.json()["detail"]
    assert response.status_code == 422 and detail.startswith("The request body is not valid: "), detail
    assert "job" not in detail.lower()


def _job_file(roots, *, gpus: str = "1", hours: str = "1.0", extra: str = "") -> str:
    _, out_root = roots
    return (
        f'name = "p"\n{extra}\n[work]\nargv = ["a"]\n[request]\ngpus = {gpus}\nhours = {hours}\n'
        f'[output]\nuri = "file://{out_root}/x"\nbytes = 10\n'
    )


HUGE_NUMBERS = {
    "gpus of 5,000 digits": {"gpus": "9" * 5000},  # past Python's int digits: tomllib raised ValueError
    "a hexadecimal gpus of 3,700 digits": {
        "gpus": "0x" + "f" * 3700
    },  # json.dumps of it raised (idempotency)
    "such a prerequisite": {"extra": "after_ok = [0x" + "f" * 3700 + "]"},
}


@pytest.mark.parametrize("case", HUGE_NUMBERS)
def test_a_job_file_with_a_number_too_large_for_any_field_is_a_file_error_on_every_channel(
    case, roots, pool, api, member_client
):
    """Reproduction: each of these answered 500 through /api/v1/jobs/file (so `e31 submit`) and both of the
    form's file actions; the JSON API answered them 400/422."""
    text = _job_file(roots, **HUGE_NUMBERS[case])
    answered = api.post("/api/v1/jobs/file", data=text, content_type="text/plain")
    assert answered.status_code == 422 and "file" in json.dumps(answered.json()), answered.content[:300]
    member_client.raise_request_exception = False
    for action in ("submit-file", "load-file"):
        page = member_client.post(reverse("jobs:new"), {"action": action, "job_file": text})
        assert page.status_code == 400 and "at most 4300 digits" in page.content.decode(), (
            action,
            page.status_code,
        )
    assert not Job.objects.exists()


def test_hours_of_400_digits_in_a_job_file_is_refused_naming_the_field(roots, pool, api):
    """Reproduction: math.isfinite() of it overflowed (500); hours are compared before any float(), as CPUs are."""
    answered = api.post(
        "/api/v1/jobs/file", data=_job_file(roots, hours="9" * 400), content_type="text/plain"
    )
    assert answered.status_code == 422
    assert [error["field"] for error in answered.json()["errors"]] == ["request.hours"]
