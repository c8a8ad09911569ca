"""The form's error summary names each field as the form labels it, not by its declaration path."""

import re

import pytest
from django.urls import reverse

from jobs import forms

pytestmark = pytest.mark.django_db


def _summary(response) -> str:
    return re.search(r'<ul class="error-list">(.*?)</ul>', response.content.decode(), re.S).group(1)


def test_the_summary_uses_the_forms_labels(member_client, roots, pool):
    response = member_client.post(
        reverse("jobs:new"),
        {
            "action": "submit", "name": "x", "work.argv": "/usr/bin/true", "work.env": "E31_X=1",
            "request.gpus": "0", "request.hours": "1", "output.bytes": "",
            "data[0].name": "corpus", "data[0].uri": "ftp://example.com/x", "data[0].bytes": "1",
        },
    )  # fmt: skip
    assert response.status_code == 422
    summary = _summary(response)
    for label in ("GPUs", "Input 1: URI", "Expected size", "Environment (E31_X)"):
        assert f"<strong>{label}</strong>" in summary, summary
    for path in ("request.gpus", "data[0].uri", "output.bytes", "work.env"):
        assert path not in summary


@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("name", "Job name"), ("work.argv[2]", "Command"), ("request.min_gpus", "Elastic minimum GPUs"),
        ("data[11].sha256", "Input 12: sha256"), ("data[3]", "Input 4"), ("output.uri", "Destination URI"),
        ("work.secrets[1]", "Secrets"),
        ("", "Job"), ("something.new", "something.new"),
    ],
)  # fmt: skip
def test_each_path_has_the_label_of_its_field(path, label):
    assert forms.field_label(path) == label
