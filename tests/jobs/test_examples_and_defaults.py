"""The README's examples, the form's placeholders and the defaults agree: what a newcomer copies works."""

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
from django.urls import reverse

from jobs import declaration, services
from jobs.models import Job
from tests.jobs.intake_channels import submit_api, submit_file, submit_form

pytestmark = pytest.mark.django_db
README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _readme_curl_body() -> dict:
    """The JSON body of the README's first `curl … /api/v1/jobs` example."""
    block = re.search(r"```sh\n(curl [^`]*?/api/v1/jobs\n)", README).group(1)
    words = shlex.split(block.replace("\\\n", " "))
    return json.loads(words[words.index("-d") + 1])


def _readme_toml() -> dict:
    return tomllib.loads(re.search(r"```toml\n(.*?)```", README, re.S).group(1))


def test_the_readmes_curl_example_is_accepted_and_delivers_under_the_teams_prefix(
    roots, pool, member_client, member_token
):
    response = submit_api(member_client, _readme_curl_body(), member_token)
    assert response.status_code == 201, response.content[:500]
    _, out_root = roots
    assert Job.objects.get().output_uri == f"file://{out_root}/"


def test_the_readmes_job_file_passes_every_rule_on_the_default_roots(settings, team, pool):
    settings.E31_DATA_ROOTS = [Path(settings.STATE_DIR / "datasets")]  # the defaults, as documented
    settings.E31_OUTPUT_ROOTS = [Path(settings.STATE_DIR / "outputs")]
    pool_of_eight = services.pool_limits(team=team)
    spec = declaration.validate(_readme_toml(), limits=pool_of_eight)
    assert spec.output_uri == f"file://{settings.STATE_DIR / 'outputs' / team.slug}/"


@pytest.mark.parametrize("channel", ["form", "file", "api"])
def test_an_output_without_a_uri_goes_to_the_teams_default_destination(
    channel, roots, pool, member_client, member_token
):
    raw = {"name": "no-uri", "work": {"argv": ["/usr/bin/true"]}, "request": {"gpus": 1, "hours": 1.0},
           "output": {"bytes": 10}}  # fmt: skip
    response = {
        "form": lambda: submit_form(member_client, raw),
        "file": lambda: submit_file(member_client, raw),
        "api": lambda: submit_api(member_client, raw, member_token),
    }[channel]()
    assert response.status_code in (201, 302), response.content[:800]
    assert Job.objects.get().output_uri == f"file://{roots[1]}/"


def test_the_form_shows_the_allowed_roots_and_the_default_destination(roots, member_client):
    page = member_client.get(reverse("jobs:new")).content.decode()
    data_root, out_root = roots
    assert f"{data_root}/" in page and f"{out_root}/" in page
    assert "default destination" in page


def test_every_file_placeholder_on_the_form_lies_under_the_teams_folders(roots, member_client):
    page = member_client.get(reverse("jobs:new")).content.decode()
    uris = re.findall(r"file://(/[^\s\"'<&]*)", page)
    assert uris, "the form shows file:// examples"
    prefixes = [*roots]
    for path in uris:
        assert declaration.resolve_under_roots(path, prefixes) is not None, path
