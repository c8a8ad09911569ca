"""The submit form's preview judges the job that submitting would store: its memory, CPUs, GPU model, data and
prerequisites, not its GPUs and hours alone. A draft the rules refuse is told so in their words; a draft they
accept is told the start and the reason its job page would show once the scheduler has planned it."""

import os
import re
from datetime import UTC, datetime, timedelta
from html import unescape

import pytest
import time_machine
from django.utils import timezone

from jobs import declaration, rental, scheduler, services
from jobs.forms import JobForm
from jobs.models import Job
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 5, 4, 12, 0, tzinfo=UTC)
GB = 10**9
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"


@pytest.fixture(autouse=True)
def frozen():
    """One instant for the preview and the pass after submitting, so their estimates can be compared."""
    with time_machine.travel(NOW, tick=False):
        yield


@pytest.fixture
def draft(roots):
    _, out = roots
    return {
        "name": "train", "work.argv": "python3\ntrain.py", "request.gpus": "1", "request.hours": "1",
        "output.uri": f"file://{out}/train", "output.bytes": "1000",
    }  # fmt: skip


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html))).strip()


def _preview(client, fields: dict) -> str:
    response = client.post("/jobs/new/estimate/", fields, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    return _text(response.content.decode())


def _as_declared(preview: str) -> str:
    """The preview's line for the draft as declared (not its variations)."""
    found = re.search(
        r"Estimated start if submitted now: (.*?)(?: What would change it| Checkpointing:|$)", preview
    )
    assert found, preview
    return found.group(1)


def _submitted_and_planned(client, fields: dict, *, staged: bool = True) -> Job:
    """Submits the draft through the form, as a member would, then lets the scheduler plan it; ``staged``: its
    staging done (a job with no data to move is queued within moments)."""
    response = client.post("/jobs/new/", {**fields, "action": "submit"})
    assert response.status_code == 302, _text(response.content.decode())[:2000]
    job = Job.objects.get(name=fields["name"])
    if staged:
        Job.objects.filter(id=job.id).update(state="queued")
    scheduler.run_pass(now=timezone.now())
    job.refresh_from_db()
    return job


def _busy(node, *, team, hours: float, gpus: int | None = None, **declared) -> Job:
    """Another job rented on ``node`` for ``hours`` (its first ``gpus`` GPUs, all by default), as RENT holds it."""
    gpus = node.gpus if gpus is None else gpus
    job = JobFactory(team=team, state="queued", gpus=gpus, hours=hours, **declared)
    assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: tuple(range(gpus))}, now=timezone.now())
    return job


def _agrees_with_the_job_page(preview: str, job: Job) -> None:
    line = _as_declared(preview)
    assert job.state == "queued" or job.state == "submitted", job.state
    assert job.estimated_start is not None, job.pending_reason
    assert f"{job.estimated_start:%H:%M} UTC" in line, (line, job.estimated_start)
    assert _text(job.pending_reason) in line, (line, job.pending_reason)
    assert "GPUs are free" not in line


# ----- refused by the rules: told so in their words


def test_more_memory_than_any_node_has_is_refused_in_the_preview_as_at_submit(member_client, team, draft):
    """Two nodes of 64 GB: 100 GB is under the pool's 128 GB, but a 1-GPU job runs on one node."""
    for name in ("gpu-01", "gpu-02"):
        NodeFactory(name=name, memory_bytes=64 * GB, cpus=16)
    fields = {**draft, "request.memory": "100 GB"}
    refused = member_client.post("/jobs/new/", {**fields, "action": "submit"})
    assert refused.status_code == 422 and not Job.objects.exists()
    with pytest.raises(declaration.DeclarationInvalid) as invalid:
        declaration.validate(
            JobForm.from_post(fields).to_declaration(), limits=services.pool_limits(team=team)
        )
    said = invalid.value.as_dict()["request.memory"]
    assert said in _text(refused.content.decode())
    preview = _preview(member_client, fields)
    assert f"No estimate yet. Memory: {said}" in preview, preview
    assert "GPUs are free" not in preview


def test_more_cpus_than_any_node_has_is_refused_in_the_preview_as_at_submit(member_client, team, draft):
    for name in ("gpu-01", "gpu-02"):
        NodeFactory(name=name, memory_bytes=64 * GB, cpus=16)
    fields = {**draft, "request.cpus": "24"}
    assert member_client.post("/jobs/new/", {**fields, "action": "submit"}).status_code == 422
    preview = _preview(member_client, fields)
    assert "No estimate yet. CPUs: a job that fits one node runs on one" in preview, preview
    assert "GPUs are free" not in preview


def test_a_gpu_model_no_node_has_is_refused_in_the_preview_as_at_submit(member_client, team, draft):
    NodeFactory(name="a-01", gpu_model=A100)
    fields = {**draft, "request.gpu_model": "H100"}
    assert member_client.post("/jobs/new/", {**fields, "action": "submit"}).status_code == 422
    preview = _preview(member_client, fields)
    assert "No estimate yet. GPU model: no node of this pool has H100 GPUs" in preview, preview


def test_a_prerequisite_that_is_not_the_teams_job_is_refused_in_the_preview_as_at_submit(
    member_client, other_team, draft
):
    NodeFactory(name="gpu-01")
    theirs = JobFactory(team=other_team)
    fields = {**draft, "after_ok": str(theirs.id)}
    refused = member_client.post("/jobs/new/", {**fields, "action": "submit"})
    assert refused.status_code == 422 and f"no job {theirs.id} in your team" in _text(
        refused.content.decode()
    )
    preview = _preview(member_client, fields)
    assert f"No estimate yet. Run after these jobs succeed: no job {theirs.id} in your team" in preview, (
        preview
    )


# ----- accepted: the preview says what the job page will


def _cpus_short(team):
    """gpu-big (64 CPUs) is busy for three hours; gpu-small, idle, has 8 CPUs: 16 wait for gpu-big."""
    _busy(NodeFactory(name="gpu-big", memory_bytes=256 * GB, cpus=64), team=team, hours=3)
    NodeFactory(name="gpu-small", memory_bytes=256 * GB, cpus=8)
    return {"request.cpus": "16"}


def _memory_short(team):
    """gpu-big (256 GB) is busy for three hours; gpu-small, idle, has 32 GB: 64 GB wait for gpu-big."""
    _busy(NodeFactory(name="gpu-big", memory_bytes=256 * GB, cpus=64), team=team, hours=3)
    NodeFactory(name="gpu-small", memory_bytes=32 * GB, cpus=64)
    return {"request.memory": "64 GB"}


def _memory_held(team):
    """The only node has 400 GB and two idle GPUs, but a job holds 250 GB of it for three hours: 200 GB wait for
    it (where a job declaring no memory, given its GPU's share of 100 GB, would start)."""
    node = NodeFactory(name="gpu-01", memory_bytes=400 * GB, cpus=64)
    _busy(node, team=team, hours=3, gpus=2, memory_bytes=250 * GB)
    return {"request.memory": "200 GB"}


def _model_busy(team):
    """The H100 node is busy for three hours; the A100 node is idle."""
    _busy(NodeFactory(name="h-01", gpu_model=H100), team=team, hours=3)
    NodeFactory(name="a-01", gpu_model=A100)
    return {"request.gpu_model": "H100"}


@pytest.mark.parametrize(
    "pool", [_cpus_short, _memory_short, _memory_held, _model_busy], ids=lambda f: f.__name__.strip("_")
)
def test_a_draft_the_free_gpus_cannot_hold_is_previewed_as_the_scheduler_plans_it(
    member_client, other_team, draft, pool
):
    fields = {**draft, **pool(other_team)}
    preview = _preview(member_client, fields)
    job = _submitted_and_planned(member_client, fields)
    assert job.estimated_start == NOW + timedelta(hours=3), job.pending_reason
    _agrees_with_the_job_page(preview, job)


def test_a_draft_whose_data_must_be_staged_first_is_not_previewed_as_starting_at_once(
    member_client, draft, roots, settings
):
    """Staging at 1 MB/s, as the scheduler assumes before a transfer says its rate, 7.2 GB take two hours."""
    settings.E31_ASSUMED_STAGE_RATE = 1e6
    NodeFactory(name="gpu-01")
    data, _ = roots
    with open(data / "corpus.bin", "wb") as f:
        os.truncate(f.fileno(), 7_200_000_000)
    fields = {
        **draft, "data[0].name": "corpus", "data[0].uri": f"file://{data}/corpus.bin",
        "data[0].bytes": "7200000000",
    }  # fmt: skip
    preview = _preview(member_client, fields)
    job = _submitted_and_planned(member_client, fields, staged=False)
    assert job.estimated_start == NOW + timedelta(hours=2), job.pending_reason
    _agrees_with_the_job_page(preview, job)


def test_a_draft_that_runs_after_a_running_job_is_previewed_as_waiting_for_it(member_client, team, draft):
    """gpu-01 runs the team's job 1 for two more hours; gpu-02 is idle. A draft after job 1 waits for it."""
    first = _busy(NodeFactory(name="gpu-01"), team=team, hours=2)
    NodeFactory(name="gpu-02")
    fields = {**draft, "after_ok": str(first.id)}
    preview = _preview(member_client, fields)
    job = _submitted_and_planned(member_client, fields, staged=False)
    assert job.estimated_start is not None and job.estimated_start >= NOW + timedelta(hours=2)
    _agrees_with_the_job_page(preview, job)


def test_a_draft_the_free_gpus_can_hold_is_still_previewed_as_starting_now(member_client, other_team, draft):
    """The same declarations on a pool with room: nothing above makes the preview wait where the pass would not."""
    NodeFactory(name="h-01", gpu_model=H100, memory_bytes=256 * GB, cpus=64)
    fields = {**draft, "request.cpus": "16", "request.memory": "64 GB", "request.gpu_model": "H100"}
    line = _as_declared(_preview(member_client, fields))
    assert "GPUs are free: it would start" in line, line
    job = _submitted_and_planned(member_client, fields)
    assert job.state == "rented"


def test_a_draft_without_its_destination_yet_is_estimated_on_a_pool_with_s3_outputs_only(
    member_client, team, settings
):
    """The preview stands in for the destination, which it does not read; on a pool that delivers to S3 alone
    (no output root, so no default folder) it refused a draft whose destination was not typed yet."""
    settings.E31_OUTPUT_ROOTS = []
    settings.E31_S3_ROOTS = ["s3://results"]
    NodeFactory(name="gpu-01")
    preview = _preview(member_client, {"request.gpus": "1", "request.hours": "1"})
    assert "Destination URI" not in preview, preview
    assert "Estimated start if submitted now" in preview, preview
