"""Team secrets: entered on a page or by API, encrypted under keys of their own, never shown again."""

import json

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from accounts import services as accounts
from accounts import team_secrets
from accounts.models import TeamSecret
from jobs.models import Job
from tests.factories import MembershipFactory
from tests.jobs.formparse import form_fields
from tests.jobs.intake_channels import submit_api, submit_form

pytestmark = pytest.mark.django_db
VALUE = "wandb-7f3c9e1a-never-shown-again"


@pytest.fixture(autouse=True)
def secrets_key(settings):
    settings.E31_SECRETS_KEYS = [Fernet.generate_key().decode()]
    return settings.E31_SECRETS_KEYS[0]


@pytest.fixture
def admin_client(client, team_admin):
    client.force_login(team_admin)
    return client


@pytest.fixture
def admin_token(team_admin) -> str:
    return accounts.create_api_token(user=team_admin, label="tests")[1]


def stored_bytes() -> bytes:
    """Every byte PostgreSQL holds for the secrets table, as text."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT row_to_json(s)::text FROM accounts_teamsecret s")
        return "".join(row[0] for row in cursor.fetchall()).encode()


def test_a_value_is_stored_encrypted_under_the_secrets_key_not_the_secret_key(team, team_admin, settings):
    team_secrets.set_secret(team=team, name="WANDB_API_KEY", value=VALUE, user=team_admin, now=timezone.now())
    assert VALUE.encode() not in stored_bytes()
    token = TeamSecret.objects.get().token
    assert Fernet(settings.E31_SECRETS_KEYS[0].encode()).decrypt(token.encode()).decode() == VALUE
    settings.E31_SECRETS_KEYS = [Fernet.generate_key().decode()]  # SECRET_KEY unchanged, secrets key gone
    with pytest.raises(team_secrets.SecretsUnavailable):
        team_secrets.values_for_attempt(team_id=team.id, declared=["WANDB_API_KEY"])


def test_rotation_reencrypts_under_the_new_key_and_the_old_key_can_go(
    team, team_admin, settings, secrets_key
):
    team_secrets.set_secret(team=team, name="HF_TOKEN", value=VALUE, user=team_admin, now=timezone.now())
    new = Fernet.generate_key().decode()
    settings.E31_SECRETS_KEYS = [new, secrets_key]
    call_command("rotate_secrets_key")
    settings.E31_SECRETS_KEYS = [new]
    assert team_secrets.values_for_attempt(team_id=team.id, declared=["HF_TOKEN"]) == {"HF_TOKEN": VALUE}


def test_without_a_configured_key_a_key_file_of_its_own_is_made_0600(team, team_admin, settings, tmp_path):
    settings.E31_SECRETS_KEYS = []
    settings.E31_SECRETS_KEY_FILE = tmp_path / "secrets.key"
    team_secrets.set_secret(team=team, name="HF_TOKEN", value=VALUE, user=team_admin, now=timezone.now())
    assert settings.E31_SECRETS_KEY_FILE.stat().st_mode & 0o777 == 0o600
    assert settings.E31_SECRETS_KEY_FILE.read_text().strip() != settings.SECRET_KEY
    assert team_secrets.values_for_attempt(team_id=team.id, declared=["HF_TOKEN"]) == {"HF_TOKEN": VALUE}


def test_the_page_sets_a_secret_and_never_shows_its_value(admin_client, team):
    response = admin_client.post(
        reverse("accounts:secrets"), {"team": "vision", "name": "WANDB_API_KEY", "value": VALUE}
    )
    assert response.status_code == 302
    page = admin_client.get(reverse("accounts:secrets"))
    assert b"WANDB_API_KEY" in page.content and VALUE.encode() not in page.content
    assert TeamSecret.objects.get().team == team


def test_a_plain_member_sees_names_but_cannot_set_or_delete(member_client, team, team_admin):
    team_secrets.set_secret(team=team, name="HF_TOKEN", value=VALUE, user=team_admin, now=timezone.now())
    page = member_client.get(reverse("accounts:secrets"))
    assert b"HF_TOKEN" in page.content and VALUE.encode() not in page.content
    refused = member_client.post(reverse("accounts:secrets"), {"team": "vision", "name": "X", "value": "y"})
    assert refused.status_code == 403
    member_client.post(reverse("accounts:delete-secret", args=["vision"]), {"name": "HF_TOKEN"})
    assert TeamSecret.objects.filter(name="HF_TOKEN").exists()


def test_another_team_neither_sees_nor_deletes_a_secret(outsider_client, team, team_admin):
    team_secrets.set_secret(team=team, name="HF_TOKEN", value=VALUE, user=team_admin, now=timezone.now())
    assert b"HF_TOKEN" not in outsider_client.get(reverse("accounts:secrets")).content
    assert (
        outsider_client.post(
            reverse("accounts:delete-secret", args=["vision"]), {"name": "HF_TOKEN"}
        ).status_code
        == 404
    )
    assert TeamSecret.objects.count() == 1


def test_a_bad_name_is_refused_with_422(admin_client, team):
    response = admin_client.post(
        reverse("accounts:secrets"), {"team": "vision", "name": "E31_JOB_ID", "value": VALUE}
    )
    assert response.status_code == 422 and VALUE.encode() not in response.content
    assert not TeamSecret.objects.exists()


def test_a_refused_secret_comes_back_with_its_team_still_chosen(client, team, other_team):
    """An admin of teams audio and vision picks vision and types a name the rules refuse: the page comes
    back with the name and the team vision still chosen, so Save, pressed again, sets it on vision."""
    both = MembershipFactory(team=team, role="admin").user
    MembershipFactory(team=other_team, user=both, role="admin")
    client.force_login(both)
    answer = client.post(reverse("accounts:secrets"), {"team": "vision", "name": "E31_TOKEN", "value": VALUE})
    assert answer.status_code == 422
    shown = form_fields(answer.content.decode(), "secret-form")
    assert (shown["team"], shown["name"]) == ("vision", "E31_TOKEN")


def api(client, method, path, token, body=None):
    return getattr(client, method)(
        path, data=json.dumps(body) if body is not None else None, content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )  # fmt: skip


def test_the_api_sets_lists_replaces_and_deletes_without_ever_answering_a_value(client, team, admin_token):
    put = api(client, "put", "/api/v1/teams/vision/secrets/WANDB_API_KEY", admin_token, {"value": VALUE})
    assert put.status_code == 200 and put.json()["name"] == "WANDB_API_KEY"
    api(client, "put", "/api/v1/teams/vision/secrets/WANDB_API_KEY", admin_token, {"value": VALUE + "2"})
    listed = api(client, "get", "/api/v1/teams/vision/secrets", admin_token)
    assert [row["name"] for row in listed.json()] == ["WANDB_API_KEY"]
    for response in (put, listed):
        assert VALUE.encode() not in response.content
    assert team_secrets.values_for_attempt(team_id=team.id, declared=["WANDB_API_KEY"]) == {
        "WANDB_API_KEY": VALUE + "2"
    }
    assert api(client, "delete", "/api/v1/teams/vision/secrets/WANDB_API_KEY", admin_token).status_code == 204
    assert not TeamSecret.objects.exists()


def test_the_api_refuses_members_and_other_teams(client, team, other_team, member_token, admin_token):
    assert (
        api(client, "put", "/api/v1/teams/vision/secrets/X", member_token, {"value": "v"}).status_code == 403
    )
    assert api(client, "put", "/api/v1/teams/audio/secrets/X", admin_token, {"value": "v"}).status_code == 404
    assert api(client, "get", "/api/v1/teams/audio/secrets", admin_token).status_code == 404
    assert (
        api(client, "put", "/api/v1/teams/vision/secrets/1BAD", admin_token, {"value": "v"}).status_code
        == 422
    )


@pytest.fixture
def declaring(roots, pool, team, team_admin):
    team_secrets.set_secret(team=team, name="WANDB_API_KEY", value=VALUE, user=team_admin, now=timezone.now())
    return {
        "name": "with-secrets",
        "work": {"argv": ["python3", "train.py"], "secrets": ["WANDB_API_KEY"]},
        "request": {"gpus": 1, "hours": 1},
        "output": {"uri": f"file://{roots[1]}/out", "bytes": 1000},
    }


def test_a_job_declares_secrets_by_name_and_its_api_and_page_show_names_only(
    declaring, client, member, member_client, member_token
):
    created = submit_api(client, declaring, member_token)
    assert created.status_code == 201, created.content
    job = Job.objects.get()
    assert job.secrets == ["WANDB_API_KEY"]
    shown = api(client, "get", f"/api/v1/jobs/{job.id}", member_token)
    page = member_client.get(reverse("jobs:detail", args=[job.id]))
    assert shown.json()["work"]["secrets"] == ["WANDB_API_KEY"]
    for response in (created, shown, page):
        assert VALUE.encode() not in response.content
    assert VALUE not in json.dumps(list(job.events.values()), default=str)


def test_the_form_takes_secret_names(declaring, member_client):
    assert submit_form(member_client, declaring).status_code == 302
    assert Job.objects.get().secrets == ["WANDB_API_KEY"]


def test_a_secret_deleted_after_intake_is_named_when_the_attempt_starts(team, team_admin):
    team_secrets.set_secret(team=team, name="HF_TOKEN", value=VALUE, user=team_admin, now=timezone.now())
    team_secrets.delete_secret(team=team, name="HF_TOKEN", user=team_admin, now=timezone.now())
    with pytest.raises(team_secrets.SecretsUnavailable, match="HF_TOKEN"):
        team_secrets.values_for_attempt(team_id=team.id, declared=["HF_TOKEN"])


def test_a_rerun_declares_the_same_secret_names(declaring, client, member_token):
    assert submit_api(client, declaring, member_token).status_code == 201
    source = Job.objects.get()
    rerun = client.post(f"/api/v1/jobs/{source.id}/rerun", HTTP_AUTHORIZATION=f"Bearer {member_token}")
    assert rerun.status_code in (200, 201), rerun.content
    assert Job.objects.exclude(id=source.id).get().secrets == ["WANDB_API_KEY"]
    assert VALUE.encode() not in rerun.content


def test_a_name_ending_in_a_newline_is_refused_not_stored_as_another_name():
    with pytest.raises(team_secrets.SecretInvalid):
        team_secrets.check_name("WANDB_API_KEY\n")


def test_a_value_holding_a_lone_surrogate_is_refused_with_422(client, team, admin_token):
    """A team admin's script PUTs a value holding the JSON escape "\\ud800", which no UTF-8 can hold: it is a
    422 that says why, and nothing is stored."""
    response = api(
        client, "put", "/api/v1/teams/vision/secrets/HF_TOKEN", admin_token, {"value": "hf_\ud800"}
    )
    assert response.status_code == 422 and "surrogate" in response.json()["detail"]
    assert not TeamSecret.objects.exists()


def test_only_a_submitter_who_may_still_act_for_the_team_passes_the_check_at_start(
    team, member, outsider, operator
):
    """An active member, an active operator (who re-runs a team's job as themselves) and a job with no submitter
    pass; a member of another team only, or a deactivated account, is refused, and the reason names why."""
    for user_id in (member.id, operator.id, None):
        team_secrets.check_submitter(team_id=team.id, user_id=user_id)
    with pytest.raises(team_secrets.SubmitterGone, match=r"^bob is no longer a member of team vision$"):
        team_secrets.check_submitter(team_id=team.id, user_id=outsider.id)
    for user in (member, operator):
        user.is_active = False
        user.save()
        with pytest.raises(
            team_secrets.SubmitterGone, match=rf"^the account {user.username} is deactivated$"
        ):
            team_secrets.check_submitter(team_id=team.id, user_id=user.id)


def test_setting_replacing_and_deleting_a_secret_is_audited_by_name_never_by_value(client, team, admin_token):
    """Reproduction: an admin's secret set, replaced and deleted left no audit entry (a delete left nothing at all)."""
    from operations.models import AuditEntry

    auth = {"HTTP_AUTHORIZATION": f"Bearer {admin_token}"}
    url = f"/api/v1/teams/{team.slug}/secrets/HF_TOKEN"
    for value in (VALUE, VALUE + "-rotated"):
        assert client.put(url, {"value": value}, content_type="application/json", **auth).status_code == 200
    assert client.delete(url, **auth).status_code == 204
    entries = list(
        AuditEntry.objects.order_by("id").values_list("action", "actor", "target", "before", "after")
    )
    assert entries == [
        ("team.secret-set", "adele", f"team:{team.slug}", {}, {"name": "HF_TOKEN"}),
        ("team.secret-replace", "adele", f"team:{team.slug}", {"name": "HF_TOKEN"}, {"name": "HF_TOKEN"}),
        ("team.secret-delete", "adele", f"team:{team.slug}", {"name": "HF_TOKEN"}, {}),
    ]
    assert VALUE not in json.dumps(list(AuditEntry.objects.values()), default=str)
