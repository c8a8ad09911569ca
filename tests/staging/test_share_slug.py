"""A team's own folder (``<root>/<slug>``) never grants what a share covers: a team whose slug is a shared
folder's name, or whose folder holds a shared folder, reads that folder only if it was shared with it."""

import os
from pathlib import Path

import pytest
from django.utils import timezone

from accounts import services as accounts
from jobs import declaration, services, sharing, staging
from jobs.models import Job
from tests.staging.conftest import file_uri, make_job, write

pytestmark = pytest.mark.django_db


def stage(job: Job) -> Job:
    staging.stage_job(job_id=job.id, now=timezone.now())
    job.refresh_from_db()
    return job


def share(path, *slugs: str):
    return sharing.share_dataset(path=str(path), team_slugs=list(slugs), by="op", now=timezone.now())


def test_a_new_team_named_like_a_shared_folder_does_not_read_it(roots, team):
    """Shared with vision only, datasets/imagenet was readable by a team created later as "ImageNet"."""
    shared = roots.data_root / "imagenet"
    write(shared / "train.bin", b"licensed" * 10)
    share(shared, "vision")
    newcomer = accounts.create_team(name="ImageNet")
    assert newcomer.slug == "imagenet"
    assert shared not in sharing.readable_roots("imagenet")
    refused = stage(make_job(newcomer, {"name": "t", "uri": file_uri(shared / "train.bin"), "bytes": 80}))
    assert (refused.state, refused.end_reason) == ("ended", "staging_failed")
    # The team it was shared with still reads it.
    assert (
        stage(make_job(team, {"name": "t", "uri": file_uri(shared / "train.bin"), "bytes": 80})).state
        == "queued"
    )


def test_a_shared_folder_inside_a_new_teams_folder_is_withheld_and_the_rest_is_its_own(roots, team):
    shared = roots.data_root / "imagenet" / "train"
    write(shared / "x.bin", b"licensed" * 10)
    share(shared, "vision")
    newcomer = accounts.create_team(name="ImageNet")
    own, _ = write(roots.data_root / "imagenet" / "mine.bin", b"m" * 10)
    os.symlink(shared / "x.bin", roots.data_root / "imagenet" / "link.bin")
    for uri in (file_uri(shared / "x.bin"), file_uri(roots.data_root / "imagenet" / "link.bin")):
        refused = stage(make_job(newcomer, {"name": "t", "uri": uri, "bytes": 80}))
        assert (refused.state, refused.end_reason) == ("ended", "staging_failed"), uri
        assert "shared" in refused.end_detail, refused.end_detail
    assert stage(make_job(newcomer, {"name": "m", "uri": file_uri(own), "bytes": 10})).state == "queued"
    assert (
        stage(make_job(team, {"name": "t", "uri": file_uri(shared / "x.bin"), "bytes": 80})).state == "queued"
    )


def test_once_shared_with_the_team_it_reads_it_again(roots, team):
    shared = roots.data_root / "imagenet"
    write(shared / "train.bin", b"licensed" * 10)
    share(shared, "vision")
    newcomer = accounts.create_team(name="ImageNet")
    share(shared, "imagenet")
    assert (
        stage(make_job(newcomer, {"name": "t", "uri": file_uri(shared / "train.bin"), "bytes": 80})).state
        == "queued"
    )


def test_a_share_inside_a_teams_folder_names_that_team(roots, team, other_team):
    """A folder of vision's own shared with audio alone would take it from vision: the share names vision too."""
    write(roots.datasets / "public" / "a.bin", b"a")
    with pytest.raises(sharing.ShareRefused, match="vision"):
        share(roots.datasets / "public", other_team.slug)
    with pytest.raises(sharing.ShareRefused, match="vision"):
        share(roots.datasets, other_team.slug)
    share(roots.datasets / "public", other_team.slug, "vision")
    assert roots.datasets / "public" in sharing.readable_roots(other_team.slug)
    assert roots.datasets in sharing.readable_roots("vision")
    # Nor is vision taken off it while others keep it; unsharing it from every team gives it back whole.
    with pytest.raises(sharing.ShareRefused, match="vision"):
        sharing.unshare_dataset(path=str(roots.datasets / "public"), team_slugs=["vision"])
    assert sharing.unshare_dataset(path=str(roots.datasets / "public"), team_slugs=[]) == 0


def test_the_declaration_refuses_a_withheld_folder_when_told_of_it(roots):
    """Submit refuses what staging would, once the caller passes the team's withheld folders."""
    shared = roots.data_root / "imagenet" / "train"
    write(shared / "x.bin", b"licensed" * 10)
    raw = {
        "name": "t", "work": {"argv": ["/usr/bin/true"]}, "data": [{"name": "t", "uri": file_uri(shared / "x.bin"), "bytes": 80}],
        "request": {"gpus": 1, "hours": 1.0}, "output": {"uri": f"file://{roots.output_root}/imagenet/r", "bytes": 10},
    }  # fmt: skip
    limits = dict(pool_gpus=8, max_hours=24, data_roots=[roots.data_root], output_roots=[roots.output_root],
                  team="imagenet")  # fmt: skip
    assert declaration.validate(raw, limits=declaration.Limits(**limits)).data[0].bytes == 80
    with pytest.raises(declaration.DeclarationInvalid) as refused:
        declaration.validate(raw, limits=declaration.Limits(**limits, withheld=[shared]))
    assert [field for field, _ in refused.value.errors] == ["data[0].uri"]


def test_submitting_a_file_in_a_withheld_folder_is_refused_at_submit(roots, team):
    """It was refused only at staging: the submission was accepted, and the declaration's file check told the
    newcomer whether a file there existed and how large it was."""
    shared = roots.data_root / "imagenet" / "train"
    write(shared / "x.bin", b"licensed" * 10)
    share(shared, "vision")
    newcomer = accounts.create_team(name="ImageNet")
    limits = services.pool_limits(team=newcomer)
    assert [Path(p) for p in limits.withheld] == [shared]
    raw = {
        "name": "t", "work": {"argv": ["/usr/bin/true"]}, "data": [{"name": "t", "uri": file_uri(shared / "x.bin"), "bytes": 1}],
        "request": {"gpus": 1, "hours": 1.0}, "output": {"uri": f"file://{roots.output_root}/imagenet/r", "bytes": 10},
    }  # fmt: skip
    with pytest.raises(declaration.DeclarationInvalid) as refused:
        declaration.validate(raw, limits=limits)
    assert (
        "data[0].uri",
        "in a folder an operator shared with other teams, not with yours",
    ) in refused.value.errors
