"""The submit form's preview ("Estimated start if submitted now") says what is wrong with a draft in the
submit rules' own words, and reads as people write."""

import re
from html import unescape

import pytest

pytestmark = pytest.mark.django_db

DRAFT = {"name": "first", "work.argv": "true", "request.gpus": "1", "request.hours": "1", "output.bytes": "1"}


def _preview(client, **over) -> str:
    response = client.post("/jobs/new/estimate/", {**DRAFT, **over}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", response.content.decode())))


def test_with_no_node_up_the_preview_says_so_as_submitting_does(member_client, team, roots):
    """A fresh console before its first node registers: not "cannot place that many GPUs" for 1 GPU."""
    text = _preview(member_client)
    assert "GPUs: no node is up yet: the pool has no GPUs to place a job on (try again shortly)" in text, text
    assert "cannot place that many" not in text


def test_a_negative_elastic_minimum_is_refused_as_the_form_refuses_it(member_client, team, pool, roots):
    text = _preview(member_client, **{"request.gpus": "2", "request.min_gpus": "-1"})
    assert "Elastic minimum: an elastic minimum is between 1 and the 2 GPUs requested" in text, text
    assert "needs -1 GPUs" not in text and "not placeable" not in text


@pytest.mark.parametrize("hours", ["100000", "1e300"])
def test_a_time_limit_over_the_pools_maximum_is_named_with_the_maximum(member_client, team, pool, roots, hours, settings):  # fmt: skip
    text = _preview(member_client, **{"request.hours": hours})
    assert f"Time limit: at most {settings.E31_MAX_JOB_HOURS:g} hours on this pool" in text, text
    assert "Enter GPUs and a time limit" not in text


def test_the_halved_request_reads_one_gpu_not_one_gpus(member_client, team, pool, roots):
    text = _preview(member_client, **{"request.gpus": "2"})
    assert "with 1 GPU " in text and "with 1 GPUs" not in text, text
    assert "with 2 GPUs" in _preview(member_client, **{"request.gpus": "4"})
