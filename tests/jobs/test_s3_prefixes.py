"""s3:// is read and written with the pool's own credentials, so a team's s3:// URIs lie under its prefix
of an operator's S3 root (E31_S3_ROOTS: ``s3://bucket/prefix/<team-slug>/``), as its file:// ones lie
under its folder of a root; with no S3 root configured, s3:// is refused."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import declaration
from jobs.models import Job
from tests.jobs.intake_channels import error_fields, submit_api, submit_file, submit_form
from tests.jobs.test_team_prefixes import declaration_for

pytestmark = pytest.mark.django_db
CHANNELS = ["form", "file", "api"]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def s3_roots(settings):
    settings.E31_S3_ROOTS = ["s3://pool-data/teams", "s3://pool-out"]
    return settings.E31_S3_ROOTS


def submit(channel: str, client, token: str, raw: dict):
    if channel == "api":
        return submit_api(client, raw, token)
    return {"form": submit_form, "file": submit_file}[channel](client, raw)


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_team_cannot_read_or_write_another_teams_s3_prefix(channel, roots, pool, s3_roots, member_client,
                                                              member_token):  # fmt: skip
    """Reproduction: vision declared audio's delivered object as its input and audio's prefix as its
    destination, and both were accepted."""
    raw = declaration_for(
        data_uri="s3://pool-data/teams/audio/812-1/model.bin", output_uri="s3://pool-out/audio/"
    )
    response = submit(channel, member_client, member_token, raw)
    assert response.status_code == 422
    assert {"data[0].uri", "output.uri"} <= set(error_fields(response))
    assert Job.objects.count() == 0


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_team_uses_its_own_s3_prefix(channel, roots, pool, s3_roots, member_client, member_token):
    raw = declaration_for(
        data_uri="s3://pool-data/teams/vision/corpus.tar", output_uri="s3://pool-out/vision/run"
    )
    assert submit(channel, member_client, member_token, raw).status_code in (201, 302)
    assert Job.objects.get().output_uri == "s3://pool-out/vision/run"


def test_without_an_s3_root_s3_is_refused(roots, pool, member_client, member_token, settings):
    settings.E31_S3_ROOTS = []
    raw = declaration_for(data_uri="s3://any-bucket/vision/a.bin", output_uri="s3://any-bucket/vision/")
    response = submit_api(member_client, raw, member_token)
    assert response.status_code == 422
    assert "E31_S3_ROOTS" in response.content.decode()


@pytest.mark.parametrize(
    "uri, under",
    [
        ("s3://pool-out/vision/", True),
        ("s3://pool-out/vision", False),  # an object beside the team's prefix, not under it
        ("s3://pool-out/vision/run/a.bin", True),
        ("s3://pool-out/visionary/a.bin", False),  # a longer slug is another team
        ("s3://pool-out/audio/a.bin", False),
        ("s3://pool-outside/vision/a.bin", False),  # another bucket
        ("s3://pool-out/vision/../audio/a.bin", False),
        ("s3://pool-out/vision/%2e%2e/audio/a.bin", False),
        ("s3://pool-out/vision/./a.bin", False),
        ("s3://pool-out/vision//a.bin", False),
        ("s3://pool-out/vision/a.bin?versionId=1", False),
        ("s3://pool-out/vision/a.bin#x", False),
        ("file:///pool-out/vision/a.bin", False),
    ],
)
def test_an_s3_uri_is_under_a_prefix_only_segment_by_segment(uri, under):
    prefixes = declaration.s3_team_prefixes(["s3://pool-out"], "vision")
    assert prefixes == ["s3://pool-out/vision/"]
    assert declaration.under_s3_prefixes(uri, prefixes) is under


def test_the_form_says_where_the_teams_s3_uris_lie_or_that_s3_is_off(roots, pool, member_client, settings):
    from django.urls import reverse

    settings.E31_S3_ROOTS = ["s3://pool-out"]
    assert "<code>s3://pool-out/vision/</code>" in member_client.get(reverse("jobs:new")).content.decode()
    settings.E31_S3_ROOTS = []
    assert "is not enabled on this pool" in member_client.get(reverse("jobs:new")).content.decode()


@pytest.mark.parametrize("key", ["model.bin", "run#1.json", "what?.txt", "%2e%2e", "a/b.bin"])
def test_a_manifest_path_is_an_object_key_taken_literally(key):
    prefixes = declaration.s3_team_prefixes(["s3://pool-out"], "vision")
    assert (
        declaration.s3_object("s3://pool-out/vision/run/7-1/", key, prefixes)
        == f"s3://pool-out/vision/run/7-1/{key}"
    )


@pytest.mark.parametrize("key", ["../escape.bin", "a/../../b.bin", "a//b.bin", "./a.bin", ""])
def test_a_manifest_path_with_an_empty_dot_or_dotdot_part_is_no_object_key(key):
    prefixes = declaration.s3_team_prefixes(["s3://pool-out"], "vision")
    with pytest.raises(declaration.OutsideTeamPrefix, match="not a plain object key"):
        declaration.s3_object("s3://pool-out/vision/run/7-1/", key, prefixes)
    with pytest.raises(declaration.OutsideTeamPrefix, match="not under the team's prefix"):
        declaration.s3_object("s3://pool-out/audio/run/7-1/", "a.bin", prefixes)


@pytest.mark.parametrize(
    "value, refused",
    [("s3://a, s3://b/x/", ""), ("s3://a,s3://a/teams", "lies inside"), ("s3://u@a", "roots, got"),
     ("s3://a?x", "roots, got"), ("https://a", "roots, got")],
)  # fmt: skip
def test_s3_roots_are_plain_and_apart(value, refused):
    """A root inside another would put every team's prefix of the inner one under one team's prefix of the outer."""
    env = {**os.environ, "E31_S3_ROOTS": value}
    code = "import django; django.setup(); from django.conf import settings; print(settings.E31_S3_ROOTS)"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    if refused:
        assert run.returncode != 0 and refused in run.stderr
    else:
        assert run.returncode == 0 and run.stdout.strip() == "['s3://a', 's3://b/x']"
