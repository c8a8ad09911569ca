"""request.memory and request.cpus: declared through the form, the job file and the API alike."""

import pytest

from jobs.models import Job
from tests.factories import NodeFactory
from tests.jobs.intake_channels import error_fields, submit_api, submit_file, submit_form

pytestmark = pytest.mark.django_db
CHANNELS = ["form", "file", "api"]


@pytest.fixture
def pool(db):
    """Two nodes of 4 GPUs, each offering 64 GB and 16 CPUs to jobs: 128 GB and 32 CPUs in all."""
    return [NodeFactory(name=f"gpu-0{i}", memory_bytes=64 * 10**9, cpus=16) for i in (1, 2)]


@pytest.fixture
def good(roots):
    _, out_root = roots
    return {
        "name": "sized",
        "work": {"argv": ["python3", "train.py"]},
        "request": {"gpus": 2, "hours": 1.0, "memory": "24 GB", "cpus": 6},
        "output": {"uri": f"file://{out_root}/sized", "bytes": 1000},
    }


def _submit(channel, client, raw, token):
    return {
        "form": lambda: submit_form(client, raw),
        "file": lambda: submit_file(client, raw),
        "api": lambda: submit_api(client, raw, token),
    }[channel]()


@pytest.mark.parametrize("channel", CHANNELS)
def test_declared_memory_and_cpus_are_stored_and_shown_through_every_channel(
    channel, good, pool, member_client, member_token
):
    response = _submit(channel, member_client, good, member_token)
    assert response.status_code in (201, 302), response.content[:500]
    job = Job.objects.get()
    assert (job.memory_bytes, job.cpus) == (24 * 10**9, 6.0)
    page = member_client.get(f"/jobs/{job.id}/").content.decode()
    assert "memory 24.0 GB" in page and "CPUs 6" in page
    shown = member_client.get(f"/api/v1/jobs/{job.id}", HTTP_AUTHORIZATION=f"Bearer {member_token}").json()
    assert (shown["request"]["memory"], shown["request"]["cpus"]) == (24 * 10**9, 6.0)


@pytest.mark.parametrize("channel", CHANNELS)
def test_undeclared_memory_and_cpus_mean_the_nodes_share(channel, good, pool, member_client, member_token):
    raw = {**good, "request": {"gpus": 2, "hours": 1.0}}
    assert _submit(channel, member_client, raw, member_token).status_code in (201, 302)
    job = Job.objects.get()
    assert (job.memory_bytes, job.cpus) == (None, None)
    assert "memory the node's share for its GPUs" in member_client.get(f"/jobs/{job.id}/").content.decode()


BAD = {
    "memory not a size": ("memory", "lots"),
    "memory negative": ("memory", -1),
    "memory true": ("memory", True),
    "memory below 16 MiB": ("memory", "1 MB"),
    "memory beyond the pool": ("memory", "1 TB"),
    "cpus zero": ("cpus", 0),
    "cpus a word": ("cpus", "four"),
    "cpus true": ("cpus", True),
    "cpus beyond the pool": ("cpus", 64),
    "cpus too large for a float": ("cpus", 10**400),
}


@pytest.mark.parametrize("channel", CHANNELS)
@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_memory_or_cpus_is_refused_naming_the_field(
    case, channel, good, pool, member_client, member_token
):
    key, value = BAD[case]
    raw = {**good, "request": {**good["request"], key: value}}
    response = _submit(channel, member_client, raw, member_token)
    assert response.status_code == 422, response.content[:500]
    assert f"request.{key}" in error_fields(response)
    assert not Job.objects.exists()


@pytest.mark.parametrize("channel", CHANNELS)
def test_an_output_past_the_largest_attempt_space_is_refused_naming_the_field(
    channel, good, pool, member_client, member_token
):
    """20 TB would be an ext4 image past its 16 TiB limit: the job ran with no disk bound at all."""
    raw = {**good, "output": {**good["output"], "bytes": "20 TB"}}
    response = _submit(channel, member_client, raw, member_token)
    assert response.status_code == 422, response.content[:500]
    assert "output.bytes" in error_fields(response)
    assert not Job.objects.exists()


@pytest.mark.parametrize("channel", CHANNELS)
@pytest.mark.parametrize(("key", "value", "said"), [("memory", "100 GB", "64.0 GB"), ("cpus", 20, "16 CPUs")])
def test_more_than_one_node_offers_is_refused_for_a_job_that_fits_one_node(
    key, value, said, channel, good, pool, member_client, member_token
):
    """The pool's sum (128 GB, 32 CPUs) would hold it, but a 1-GPU job runs on one node of 64 GB and 16 CPUs:
    accepted, it would wait for ever."""
    raw = {**good, "request": {"gpus": 1, "hours": 1.0, key: value}}
    response = _submit(channel, member_client, raw, member_token)
    assert response.status_code == 422, response.content[:500]
    assert error_fields(response) == {f"request.{key}"}
    assert f"a job that fits one node runs on one: a node of 1 GPU or more offers at most {said}" in (
        response.content.decode()
    )
    raw["request"] = {"gpus": 8, "hours": 1.0, key: value}  # spanning both nodes: half on each
    assert _submit(channel, member_client, raw, member_token).status_code in (201, 302)
