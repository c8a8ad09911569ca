"""POST /api/v1/jobs with an Idempotency-Key: a retried submission never makes a second job."""

import json
import threading
from datetime import timedelta

import pytest
import time_machine
from django.db import IntegrityError, connection, transaction
from django.test import Client
from django.utils import timezone

from accounts import services as accounts
from jobs.models import Job, SubmissionKey
from tests.factories import JobFactory, MembershipFactory, UserFactory


@pytest.fixture
def body(roots):
    _, out_root = roots
    return {
        "name": "sweep-lr",
        "work": {"argv": ["python3", "train.py"]},
        "request": {"gpus": 1, "hours": 1.0},
        "output": {"uri": f"file://{out_root}/sweep", "bytes": 1000},
    }


def post(token: str, body: dict, key: str | None = None, client: Client | None = None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return (client or Client()).post(
        "/api/v1/jobs", json.dumps(body), content_type="application/json", **headers
    )


@pytest.mark.django_db
def test_a_retry_with_the_same_key_and_body_returns_the_first_job(pool, member_token, body):
    first = post(member_token, body, "k-1")
    again = post(member_token, dict(reversed(body.items())), "k-1")  # same body, other key order
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"] and Job.objects.count() == 1


@pytest.mark.django_db
def test_the_same_key_with_another_body_is_a_409_and_makes_nothing(pool, member_token, body):
    first = post(member_token, body, "k-1")
    other = post(member_token, {**body, "name": "sweep-lr-2"}, "k-1")
    assert other.status_code == 409 and str(first.json()["id"]) in other.json()["detail"]
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_keys_are_scoped_to_the_user(pool, team, member_token, body):
    colleague = MembershipFactory(team=team, user=UserFactory(username="carol")).user
    _, colleague_token = accounts.create_api_token(user=colleague, label="ci")
    mine, theirs = post(member_token, body, "nightly"), post(colleague_token, body, "nightly")
    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert mine.json()["id"] != theirs.json()["id"]


@pytest.mark.django_db
def test_a_key_is_forgotten_after_24_hours(pool, member_token, body):
    first = post(member_token, body, "daily")
    with time_machine.travel(timezone.now() + timedelta(hours=24, seconds=1)):
        later = post(member_token, body, "daily")
    assert later.status_code == 201 and later.json()["id"] != first.json()["id"]
    assert SubmissionKey.objects.get().job_id == later.json()["id"]


@pytest.mark.django_db
def test_without_a_key_each_post_is_a_new_job_and_a_malformed_key_is_refused(pool, member_token, body):
    assert post(member_token, body).status_code == post(member_token, body).status_code == 201
    assert post(member_token, body, "has space").status_code == 422
    assert Job.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_with_one_key_make_one_job(pool, member_token, body):
    assert connection.vendor == "postgresql"
    barrier, answers = threading.Barrier(8), []

    def retry():
        barrier.wait()
        answers.append(post(member_token, body, "burst"))
        connection.close()

    threads = [threading.Thread(target=retry) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(a.status_code for a in answers) == [200] * 7 + [201]
    assert len({a.json()["id"] for a in answers}) == 1 and Job.objects.count() == 1


@pytest.mark.django_db
def test_the_database_refuses_a_second_job_for_one_users_key(member, team):
    SubmissionKey.objects.create(
        user=member, key="k", body_sha256="a", job=JobFactory(team=team), created_at=timezone.now()
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        SubmissionKey.objects.create(
            user=member, key="k", body_sha256="a", job=JobFactory(team=team), created_at=timezone.now()
        )


@pytest.mark.django_db
def test_a_toml_job_file_is_read_by_the_forms_rules_and_honours_the_key(pool, member_token, roots):
    _, out_root = roots
    text = f"""name = "from-a-file"
[work]
argv = ["python3", "train.py"]
[request]
gpus = 1
hours = 0.5
[output]
uri = "file://{out_root}/f"
bytes = "2 KB"
"""
    headers = {"HTTP_AUTHORIZATION": f"Bearer {member_token}", "HTTP_IDEMPOTENCY_KEY": "file-1"}
    first = Client().post("/api/v1/jobs/file", text, content_type="application/toml", **headers)
    again = Client().post("/api/v1/jobs/file", text, content_type="application/toml", **headers)
    assert (first.status_code, again.status_code) == (201, 200) and first.json()["id"] == again.json()["id"]
    assert Job.objects.get().output_bytes == 2000
    broken = Client().post("/api/v1/jobs/file", "name = [", content_type="application/toml", **headers)
    assert broken.status_code == 422 and broken.json()["errors"][0]["field"] == "file"


@pytest.mark.django_db
def test_a_job_file_sent_again_with_its_key_for_another_team_is_not_the_first_teams_job(
    pool, member, member_token, other_team, roots
):
    """`e31 submit job.toml --team vision --key K`, then `--team audio --key K`: the team is part of the body."""
    MembershipFactory(team=other_team, user=member)
    text = 'name = "f"\n[work]\nargv = ["true"]\n[request]\ngpus = 1\nhours = 1\n[output]\nbytes = 10\n'
    headers = {"HTTP_AUTHORIZATION": f"Bearer {member_token}", "HTTP_IDEMPOTENCY_KEY": "file-2"}

    def send(team: str):
        return Client().post(
            f"/api/v1/jobs/file?team={team}", text, content_type="application/toml", **headers
        )

    assert (send("vision").status_code, send("audio").status_code) == (201, 409)
    assert list(Job.objects.values_list("team__slug", flat=True)) == ["vision"]
