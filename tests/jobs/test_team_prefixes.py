"""Data and outputs belong to a team: file:// URIs lie under <root>/<team-slug>/, or a folder shared with it."""

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from accounts import services as accounts
from jobs.models import Job
from tests.jobs.intake_channels import error_fields, submit_api, submit_file, submit_form

pytestmark = pytest.mark.django_db
CHANNELS = ["form", "file", "api"]


@pytest.fixture
def outsider_token(outsider) -> str:
    _, token = accounts.create_api_token(user=outsider, label="tests")
    return token


def declaration_for(*, data_uri: str | None, output_uri: str) -> dict:
    data = [{"name": "d", "uri": data_uri, "bytes": 3}] if data_uri else []
    return {
        "name": "cross", "work": {"argv": ["/usr/bin/true"]}, "data": data,
        "request": {"gpus": 1, "hours": 1.0}, "output": {"uri": output_uri, "bytes": 10},
    }  # fmt: skip


def submit(channel: str, client, token: str, raw: dict):
    if channel == "api":
        return submit_api(client, raw, token)
    return {"form": submit_form, "file": submit_file}[channel](client, raw)


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_team_cannot_declare_another_teams_destination(
    channel, roots, pool, outsider_client, outsider_token
):
    """Reproduction 5: team B declared output file://<root>/demo1 (team A's destination) and replaced ok.txt."""
    _, vision_out = roots
    raw = declaration_for(data_uri=None, output_uri=f"file://{vision_out}/demo1")
    response = submit(channel, outsider_client, outsider_token, raw)
    assert response.status_code == 422
    assert "output.uri" in error_fields(response)
    assert Job.objects.count() == 0


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_destination_at_the_top_of_a_root_belongs_to_no_team_and_is_refused(
    channel, roots, pool, member_client, member_token
):
    _, vision_out = roots
    raw = declaration_for(data_uri=None, output_uri=f"file://{vision_out.parent}/demo1")
    response = submit(channel, member_client, member_token, raw)
    assert response.status_code == 422 and "output.uri" in error_fields(response)


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_team_cannot_read_another_teams_data(channel, roots, pool, outsider_client, outsider_token):
    vision_data, _ = roots
    (vision_data / "a.bin").write_bytes(b"abc")
    audio_out = roots[1].parent / "audio"
    raw = declaration_for(data_uri=f"file://{vision_data}/a.bin", output_uri=f"file://{audio_out}/run")
    response = submit(channel, outsider_client, outsider_token, raw)
    assert response.status_code == 422
    assert error_fields(response) == {"data[0].uri"}


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_team_uses_its_own_folders(channel, roots, pool, member_client, member_token):
    vision_data, vision_out = roots
    (vision_data / "a.bin").write_bytes(b"abc")
    raw = declaration_for(data_uri=f"file://{vision_data}/a.bin", output_uri=f"file://{vision_out}/run")
    assert submit(channel, member_client, member_token, raw).status_code in (201, 302)


def test_a_folder_shared_by_an_operator_is_readable_by_the_named_teams_only(
    roots, pool, member_client, member_token, outsider_client, outsider_token, other_team
):
    data_root = roots[0].parent
    (data_root / "shared" / "imagenet").mkdir(parents=True)
    (data_root / "shared" / "imagenet" / "train.bin").write_bytes(b"abc")
    uri = f"file://{data_root}/shared/imagenet/train.bin"
    audio = declaration_for(data_uri=uri, output_uri=f"file://{roots[1].parent}/audio/run")
    vision = declaration_for(data_uri=uri, output_uri=f"file://{roots[1]}/run")
    assert submit_api(outsider_client, audio, outsider_token).status_code == 422

    call_command("share_dataset", str(data_root / "shared" / "imagenet"), "--team", "audio")
    assert submit_api(outsider_client, audio, outsider_token).status_code == 201
    refused = submit_api(member_client, vision, member_token)
    assert refused.status_code == 422 and error_fields(refused) == {"data[0].uri"}

    call_command("share_dataset", str(data_root / "shared" / "imagenet"), "--revoke")
    assert submit_api(outsider_client, audio, outsider_token).status_code == 422


def test_only_a_folder_under_a_data_root_can_be_shared(roots, other_team, tmp_path):
    with pytest.raises(CommandError, match="not a folder under a data root"):
        call_command("share_dataset", str(tmp_path), "--team", "audio")
    with pytest.raises(CommandError, match="no such team"):
        call_command("share_dataset", str(roots[0]), "--team", "nobody")


@pytest.mark.parametrize("channel", CHANNELS)
@pytest.mark.parametrize("tail", ["?x", "#x", "?", "/run?attempt=1"])
def test_a_file_destination_with_a_query_or_fragment_is_refused(
    channel, tail, roots, pool, member_client, member_token
):
    """Reproduction: output file://<root>/vision/shared?x passed; the attempt's folder went into the query, so
    every job delivered into .../shared itself and replaced the files of the one before."""
    _, vision_out = roots
    raw = declaration_for(data_uri=None, output_uri=f"file://{vision_out}/shared{tail}")
    response = submit(channel, member_client, member_token, raw)
    assert response.status_code == 422 and "output.uri" in error_fields(response)
    assert Job.objects.count() == 0


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_file_input_with_a_query_is_refused(channel, roots, pool, member_client, member_token):
    """file:// has no query: staging would read the path and drop the rest without a word."""
    vision_data, vision_out = roots
    (vision_data / "a.bin").write_bytes(b"abc")
    raw = declaration_for(data_uri=f"file://{vision_data}/a.bin?v=2", output_uri=f"file://{vision_out}/run")
    response = submit(channel, member_client, member_token, raw)
    assert response.status_code == 422 and error_fields(response) == {"data[0].uri"}
