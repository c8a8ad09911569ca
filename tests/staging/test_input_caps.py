"""The staging cache is one disk for the whole pool: no job's inputs may take it past E31_STAGE_CACHE_BYTES.

A declared input larger than the cache, or a job whose inputs together are, is refused at submit; a fill that
would take the cache past its capacity, counting what live jobs pin and what is being copied, ends the job's
staging with the reason instead of filling the disk.
"""

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs import declaration, staging
from jobs.models import DatasetCacheEntry, Job
from tests.jobs.intake_channels import error_fields, submit_api, submit_file, submit_form
from tests.staging.conftest import file_uri, make_job, write

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _one_team_may_take_it_all(settings):
    """The pool-wide cap, alone: a team's share of it is tests/staging/test_team_share.py's."""
    settings.E31_STAGE_TEAM_SHARE = 1.0


def stage(job: Job) -> Job:
    staging.stage_job(job_id=job.id, now=timezone.now())
    job.refresh_from_db()
    return job


def cache_bytes_on_disk(roots) -> int:
    folder = roots.staging / "cache"
    return sum(p.stat().st_size for p in folder.iterdir()) if folder.is_dir() else 0


def declared(*inputs: tuple[str, str, int], output_uri: str) -> dict:
    return {
        "name": "big", "work": {"argv": ["/usr/bin/true"]},
        "data": [{"name": n, "uri": u, "bytes": b} for n, u, b in inputs],
        "request": {"gpus": 1, "hours": 1.0}, "output": {"uri": output_uri, "bytes": 10},
    }  # fmt: skip


def limits(roots, capacity: int) -> declaration.Limits:
    return declaration.Limits(
        pool_gpus=8, max_hours=24, data_roots=[roots.data_root], output_roots=[roots.output_root],
        team="vision", stage_cache_bytes=capacity,
    )  # fmt: skip


# --------------------------------------------------------------------------- at submit


def test_an_input_larger_than_the_whole_staging_cache_is_refused_naming_the_limit(roots):
    raw = declared(("huge", "https://example.org/huge.bin", "900 PB"), output_uri=f"file://{roots.outputs}/r")
    with pytest.raises(declaration.DeclarationInvalid) as refused:
        declaration.validate(raw, limits=limits(roots, 1000))
    (field, message), *_ = refused.value.errors
    assert field == "data[0].bytes"
    assert "1.0 KB (1,000 bytes)" in message, message
    assert "E31_STAGE_CACHE_BYTES" in message


def test_inputs_that_together_exceed_the_staging_cache_are_refused(roots):
    raw = declared(
        ("a", "https://example.org/a.bin", 600), ("b", "https://example.org/b.bin", 600),
        output_uri=f"file://{roots.outputs}/r",
    )  # fmt: skip
    with pytest.raises(declaration.DeclarationInvalid) as refused:
        declaration.validate(raw, limits=limits(roots, 1000))
    assert [field for field, _ in refused.value.errors] == ["data"]
    assert "E31_STAGE_CACHE_BYTES" in refused.value.errors[0][1]
    # Each alone fits, and so do both together on a larger cache.
    assert declaration.validate(raw, limits=limits(roots, 1200)).data[1].bytes == 600


def test_the_limit_is_the_configured_capacity_when_the_caller_names_none(roots, settings):
    settings.E31_STAGE_CACHE_BYTES = 1000
    raw = declared(("huge", "https://example.org/huge.bin", 1001), output_uri=f"file://{roots.outputs}/r")
    bare = declaration.Limits(
        pool_gpus=8, max_hours=24, data_roots=[roots.data_root], output_roots=[roots.output_root]
    )
    with pytest.raises(declaration.DeclarationInvalid):
        declaration.validate(raw, limits=bare)


@pytest.mark.parametrize("channel", ["form", "file", "api"])
def test_every_intake_channel_refuses_an_input_larger_than_the_cache(
    channel, roots, pool, member_client, member_token, settings
):
    settings.E31_STAGE_CACHE_BYTES = 1000
    path, _ = write(roots.datasets / "big.bin", b"z" * 50_000)
    raw = declared(("big", file_uri(path), 50_000), output_uri=f"file://{roots.outputs}/r")
    if channel == "api":
        response = submit_api(member_client, raw, member_token)
    else:
        response = {"form": submit_form, "file": submit_file}[channel](member_client, raw)
    assert response.status_code == 422
    assert error_fields(response) == {"data[0].bytes"}
    assert Job.objects.count() == 0


def test_the_submit_page_states_the_limit(roots, pool, member_client, settings):
    settings.E31_STAGE_CACHE_BYTES = 5 * 10**9
    page = member_client.get(reverse("jobs:new")).content.decode()
    assert "5.0 GB" in page and "staging cache" in page


# --------------------------------------------------------------------------- at staging


def test_a_job_submitted_before_the_limit_cannot_fill_the_cache_past_its_capacity(roots, team, settings):
    """A job already stored (submitted before the capacity was lowered) with an input larger than the cache."""
    settings.E31_STAGE_CACHE_BYTES = 1000
    path, _ = write(roots.datasets / "big.bin", b"z" * 50_000)
    job = stage(make_job(team, {"name": "big", "uri": file_uri(path), "bytes": 50_000}))
    assert (job.state, job.end_reason) == ("ended", "staging_failed")
    assert "staging cache" in job.end_detail and "E31_STAGE_CACHE_BYTES" in job.end_detail
    assert cache_bytes_on_disk(roots) == 0
    assert not DatasetCacheEntry.objects.exists()


def test_a_fill_past_what_live_jobs_pin_ends_the_staging_and_keeps_their_data(roots, team, settings):
    settings.E31_STAGE_CACHE_BYTES = 2500
    a, _ = write(roots.datasets / "a.bin", b"a" * 1000)
    b, _ = write(roots.datasets / "b.bin", b"b" * 1000)
    c, _ = write(roots.datasets / "c.bin", b"c" * 1000)
    first = stage(make_job(team, {"name": "a", "uri": file_uri(a), "bytes": 1000}))
    second = stage(make_job(team, {"name": "b", "uri": file_uri(b), "bytes": 1000}))
    assert first.state == second.state == "queued"  # both pin their data until they are released
    third = stage(make_job(team, {"name": "c", "uri": file_uri(c), "bytes": 1000}))
    assert (third.state, third.end_reason) == ("ended", "staging_failed")
    assert "this input's 1,000 bytes" in third.end_detail and "2,500 bytes" in third.end_detail
    assert "2,000" not in third.end_detail  # what the pool holds is not told (other teams' inputs count)
    assert third.inputs.get().stage_state == "failed"
    assert cache_bytes_on_disk(roots) == 2000
    assert (roots.staging / str(first.id) / "a").read_bytes() == b"a" * 1000

    Job.objects.filter(id=first.id).update(state="ended", end_reason="succeeded")  # its pin is gone
    assert (
        stage(make_job(team, {"name": "c", "uri": file_uri(c), "bytes": 1000}, name="again")).state
        == "queued"
    )
    assert cache_bytes_on_disk(roots) == 2000  # the unpinned entry made room


def test_an_entry_being_copied_counts_against_the_room_of_another_fill(roots, team, settings):
    """Two fills at once: the second to claim its transfer slot finds the first's bytes already promised."""
    settings.E31_STAGE_CACHE_BYTES = 1500
    a, _ = write(roots.datasets / "a.bin", b"a" * 1000)
    b, _ = write(roots.datasets / "b.bin", b"b" * 1000)
    copying = make_job(team, {"name": "a", "uri": file_uri(a), "bytes": 1000}, state="staging")
    Job.objects.filter(id=copying.id).update(worker_seen_at=timezone.now())
    held = copying.inputs.get()
    DatasetCacheEntry.objects.create(
        key="k" * 64, uri=held.uri, bytes=1000, state=DatasetCacheEntry.FILLING, filler="t", filling_input=held,
        created_at=timezone.now(), updated_at=timezone.now(), last_used_at=timezone.now(),
    )  # fmt: skip
    assert staging.claim_slot(data_input_id=held.id, now=timezone.now())  # it holds a slot: its copy runs
    job = stage(make_job(team, {"name": "b", "uri": file_uri(b), "bytes": 1000}))
    assert (job.state, job.end_reason) == ("ended", "staging_failed")
    assert "no room in the staging cache now" in job.end_detail, job.end_detail


def test_no_room_never_tells_a_team_what_other_teams_hold_in_the_cache(roots, team, other_team, settings):
    """Reproduction: the "no room" end gave the pool-wide bytes held, to the byte ("1,234,567 of its …"), on
    the job page, the API, e-mails and webhooks: a free probe (nothing is metered before RENT) of when other
    teams stage data, and how much. The team is told its own input's size and the cache's capacity only."""
    settings.E31_STAGE_CACHE_BYTES = 2_000_000
    theirs = make_job(other_team, {"name": "x", "uri": "https://example.org/x.bin", "bytes": 1_234_567})
    held = theirs.inputs.get()
    entry = DatasetCacheEntry.objects.create(
        key="o" * 64, uri=held.uri, bytes=1_234_567, state=DatasetCacheEntry.READY,
        created_at=timezone.now(), updated_at=timezone.now(), last_used_at=timezone.now(),
    )  # fmt: skip
    entry.inputs.add(held)
    Job.objects.filter(id=theirs.id).update(state="queued")  # alive: its entry is pinned
    path, _ = write(roots.datasets / "mine.bin", b"m" * 800_000)

    job = stage(make_job(team, {"name": "m", "uri": file_uri(path), "bytes": 800_000}))

    assert (job.state, job.end_reason) == ("ended", "staging_failed")
    for figure in ("1,234,567", "1234567", "765,433", "765433", "1.2 MB", "765"):
        assert figure not in job.end_detail, job.end_detail
    assert "800,000" in job.end_detail and "2,000,000" in job.end_detail
