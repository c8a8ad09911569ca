"""A registry answering with something that is not an image manifest fails the staging with that reason.

A parse or shape error (a list, a string, a missing digest) used to escape the stager as a bare
ValueError, AttributeError or KeyError: the job stayed in STAGING and the reconciler sent it back for
ever, every stale period.
"""

import json

import pytest
from django.utils import timezone

from jobs import imageref, staging, transfers
from jobs.transfers import registry
from tests.factories import JobFactory, TeamFactory

NOT_A_MANIFEST = "the registry's manifest is not a valid image manifest"
INSTANCE = "sha256:" + "a" * 64
LINUX = {"os": "linux", "architecture": registry.ARCH}

MALFORMED = {
    "not json": b"not json",
    "a list": b"[]",
    "a string": b'"manifest"',
    "not utf-8": b"\xff\xfe{}",
    "config not an object": json.dumps({"config": "x", "layers": []}).encode(),
    "layers not a list": json.dumps({"config": {}, "layers": 7}).encode(),
    "a layer not an object": json.dumps({"config": {}, "layers": [1]}).encode(),
    "a size not a number": json.dumps({"config": {"size": "big"}, "layers": []}).encode(),
    "a negative size": json.dumps({"config": {"size": 1}, "layers": [{"size": -(2**40)}]}).encode(),
    "an index entry without a digest": json.dumps({"manifests": [{"platform": LINUX}]}).encode(),
    "an index entry's digest not a string": json.dumps(
        {"manifests": [{"platform": LINUX, "digest": 7}]}
    ).encode(),
    "an index entry not an object": json.dumps({"manifests": ["x"]}).encode(),
    "an index's platform not an object": json.dumps({"manifests": [{"platform": "linux"}]}).encode(),
    "manifests not a list": json.dumps({"manifests": 7}).encode(),
}


def answering(monkeypatch, *bodies: bytes) -> None:
    """The registry answers each manifest request with the next body."""
    answers = iter(bodies)
    monkeypatch.setattr(registry, "_inspect", lambda *args, **kwargs: next(answers))


@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_manifest_is_a_transfer_failure_saying_so(monkeypatch, body):
    answering(monkeypatch, body)
    with pytest.raises(transfers.TransferFailed, match=NOT_A_MANIFEST):
        registry.resolve(imageref.parse("reg.example.com/team/app:1"), access=registry.Access())


@pytest.mark.parametrize("body", [b"[]", b"not json", json.dumps({"layers": {"a": 1}}).encode()])
def test_a_malformed_manifest_behind_an_index_is_a_transfer_failure_saying_so(monkeypatch, body):
    index = json.dumps({"manifests": [{"platform": LINUX, "digest": INSTANCE}]}).encode()
    answering(monkeypatch, index, body)
    with pytest.raises(transfers.TransferFailed, match=NOT_A_MANIFEST):
        registry.resolve(imageref.parse("reg.example.com/team/app:1"), access=registry.Access())


def test_a_well_formed_manifest_still_resolves_to_its_bytes(monkeypatch):
    body = json.dumps({"config": {"size": 10}, "layers": [{"size": 5}, {"size": 7}]}).encode()
    answering(monkeypatch, body)
    resolved = registry.resolve(imageref.parse("reg.example.com/team/app:1"), access=registry.Access())
    assert resolved.bytes == 22


def _layout(tmp_path, manifest: bytes, config: bytes):
    """An OCI layout as skopeo leaves it, holding the given manifest and config blobs."""
    blobs = tmp_path / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    (blobs / ("b" * 64)).write_bytes(manifest)
    (blobs / ("c" * 64)).write_bytes(config)
    (tmp_path / "index.json").write_text(json.dumps({"manifests": [{"digest": "sha256:" + "b" * 64}]}))
    return tmp_path


CONFIG_DIGEST = json.dumps({"config": {"digest": "sha256:" + "c" * 64}}).encode()
MALFORMED_CONFIGS = {
    "manifest a list": (b"[]", b"{}"),
    "manifest without a config": (b"{}", b"{}"),
    "config not json": (CONFIG_DIGEST, b"not json"),
    "config a list": (CONFIG_DIGEST, b"[]"),
    "its config not an object": (CONFIG_DIGEST, json.dumps({"config": ["Env"]}).encode()),
    "Env a string": (CONFIG_DIGEST, json.dumps({"config": {"Env": "PATH=/bin"}}).encode()),
    "Cmd holding a number": (CONFIG_DIGEST, json.dumps({"config": {"Cmd": ["sh", 1]}}).encode()),
    "WorkingDir a list": (CONFIG_DIGEST, json.dumps({"config": {"WorkingDir": ["/srv"]}}).encode()),
    # Neither goes into an argument list or the database's JSON: the cache entry's write failed as a database error
    # (PostgreSQL refuses both), which the stager leaves to the reconciler, so the job was staged again, pull and
    # all, at every reconcile, for ever.
    "Env holding a NUL": (CONFIG_DIGEST, json.dumps({"config": {"Env": ["A=x\u0000y"]}}).encode()),
    "Cmd holding half a character": (
        CONFIG_DIGEST,
        json.dumps({"config": {"Cmd": ["sh", "\ud800"]}}).encode(),
    ),
    "WorkingDir holding a NUL": (
        CONFIG_DIGEST,
        json.dumps({"config": {"WorkingDir": "/srv\u0000"}}).encode(),
    ),
}


@pytest.mark.parametrize("manifest, config", MALFORMED_CONFIGS.values(), ids=MALFORMED_CONFIGS.keys())
def test_a_malformed_image_configuration_is_a_transfer_failure_saying_so(tmp_path, manifest, config):
    with pytest.raises(transfers.TransferFailed, match="the image's configuration is not valid"):
        registry.image_config(_layout(tmp_path, manifest, config))


def test_a_well_formed_image_configuration_is_read(tmp_path):
    config = {"config": {"Env": ["PATH=/bin"], "Cmd": ["sh"], "WorkingDir": "/srv", "User": "1"}}
    layout = _layout(tmp_path, CONFIG_DIGEST, json.dumps(config).encode())
    assert registry.image_config(layout) == {"Env": ["PATH=/bin"], "Cmd": ["sh"], "WorkingDir": "/srv"}


@pytest.mark.django_db
@pytest.mark.parametrize("body", [b"[]", b"not json"])
def test_a_job_whose_registry_serves_a_malformed_manifest_ends_staging_failed(monkeypatch, settings, body):
    """It stayed in STAGING, re-sent by the reconciler every stale period, for ever."""
    settings.E31_POOL_REGISTRIES = ["reg.example.com"]
    monkeypatch.setattr(registry, "_inspect", lambda *args, **kwargs: body)
    job = JobFactory(team=TeamFactory(), state="submitted", image="reg.example.com/team/app:1", argv=[])
    staging.stage_job(job_id=job.id, now=timezone.now())
    job.refresh_from_db()
    assert (job.state, job.end_reason) == ("ended", "staging_failed")
    assert NOT_A_MANIFEST in job.end_detail
    assert job.image_pull.stage_state == "failed"
