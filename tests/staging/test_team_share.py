"""One team's inputs take at most E31_STAGE_TEAM_SHARE of the staging cache, so no team can take it from the others.

Found by trying it: an input being copied counts against the cache at its full declared size, and one input could
be as large as the whole cache. A team declared one http(s) input that large and served it just above the speed
floor (E31_TRANSFER_MIN_RATE_BPS): for the 23 days the copy would last at 100 KB/s, every other team's staging
ended "no room in the staging cache", unmetered. A team's entries and copies in progress now take at most its
share; one input, or one job's inputs, at most that share, refused at submit; other teams keep the rest.
"""

import pytest
from django.utils import timezone

from jobs import declaration, staging
from jobs.models import DatasetCacheEntry, Job
from tests.staging.conftest import file_uri, make_job, write
from tests.staging.test_input_caps import declared, limits

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _share(settings):
    settings.E31_STAGE_CACHE_BYTES = 2000
    settings.E31_STAGE_TEAM_SHARE = 0.5


def _copying(team, roots, n: int) -> None:
    """A fill of ``n`` bytes of ``team`` holding a transfer slot, its stager alive (a slow source's, say)."""
    path, _ = write(roots.datasets / f"slow-{n}.bin", b"s" * n)
    job = make_job(team, {"name": "slow", "uri": file_uri(path), "bytes": n}, state="staging", name="slow")
    Job.objects.filter(id=job.id).update(worker_seen_at=timezone.now())
    held = job.inputs.get()
    DatasetCacheEntry.objects.create(
        key="s" * 64, uri=held.uri, bytes=n, state=DatasetCacheEntry.FILLING, filler="t", filling_input=held,
        created_at=timezone.now(), updated_at=timezone.now(), last_used_at=timezone.now(),
    )  # fmt: skip
    assert staging.claim_slot(data_input_id=held.id, now=timezone.now())


def _stage(job: Job) -> Job:
    staging.stage_job(job_id=job.id, now=timezone.now())
    job.refresh_from_db()
    return job


def test_a_team_at_its_share_stages_no_more_while_other_teams_stage_theirs(roots, team, other_team):
    _copying(team, roots, 1000)
    mine, _ = write(roots.datasets / "more.bin", b"m" * 10)
    refused = _stage(make_job(team, {"name": "more", "uri": file_uri(mine), "bytes": 10}))
    assert (refused.state, refused.end_reason) == ("ended", "staging_failed")
    assert "E31_STAGE_TEAM_SHARE" in refused.end_detail and "1,000" in refused.end_detail, refused.end_detail

    folder = roots.data_root / "audio"
    theirs, _ = write(folder / "theirs.bin", b"t" * 900)
    staged = _stage(make_job(other_team, {"name": "theirs", "uri": file_uri(theirs), "bytes": 900}))
    assert staged.state == "queued", staged.end_detail


def test_an_input_larger_than_a_teams_share_is_refused_at_submit(roots):
    raw = declared(("big", "https://example.org/big.bin", 1001), output_uri=f"file://{roots.outputs}/r")
    with pytest.raises(declaration.DeclarationInvalid) as refused:
        declaration.validate(raw, limits=limits(roots, 2000))
    (field, message), *_ = refused.value.errors
    assert field == "data[0].bytes" and "E31_STAGE_TEAM_SHARE" in message, message
    fits = declared(("big", "https://example.org/big.bin", 1000), output_uri=f"file://{roots.outputs}/r")
    assert declaration.validate(fits, limits=limits(roots, 2000)).data[0].bytes == 1000
