"""Staging never escapes its roots and never reaches the pool's own network unless allowed."""

import os
import socket

import pytest
from django.utils import timezone

from common import pinned
from jobs import staging, transfers
from jobs.models import Job
from jobs.transfers import sources
from tests.staging.conftest import file_uri, make_job, write

pytestmark = pytest.mark.django_db


def stage(job: Job) -> Job:
    staging.stage_job(job_id=job.id, now=timezone.now())
    job.refresh_from_db()
    return job


def test_dotdot_cannot_lead_out_of_the_data_roots(roots, team):
    write(roots.outside / "secret.txt", b"s" * 10)
    uri = file_uri(roots.datasets) + "/../../outside/secret.txt"
    job = stage(make_job(team, {"name": "s", "uri": uri, "bytes": 10}))
    assert job.end_reason == "staging_failed" and "not under an allowed data root" in job.end_detail


def test_another_teams_data_is_refused_at_staging_too(roots, team):
    """Intake refuses it; staging checks the team's folder again as it opens the file."""
    write(roots.data_root / "audio" / "a.bin", b"a" * 10)
    job = stage(
        make_job(team, {"name": "a", "uri": file_uri(roots.data_root / "audio" / "a.bin"), "bytes": 10})
    )
    assert job.end_reason == "staging_failed" and "not under an allowed data root" in job.end_detail


@pytest.mark.parametrize("s3_roots", [["s3://bucket"], []])
def test_another_teams_s3_object_is_refused_at_staging_too(roots, team, settings, s3_roots):
    """Intake refuses it; staging checks the team's prefix of the S3 roots configured now before it reads."""
    settings.E31_S3_ROOTS = s3_roots
    job = stage(make_job(team, {"name": "a", "uri": "s3://bucket/audio/a.bin", "bytes": 10}))
    assert job.end_reason == "staging_failed" and "not under the team's prefix" in job.end_detail


def test_an_s3_destination_outside_the_teams_prefix_ends_the_job_at_staging_before_any_gpu(
    roots, team, settings
):
    """A job submitted before the operator changed E31_S3_ROOTS (or requeued by one) fails here, off the meter,
    not after its run at delivery."""
    settings.E31_S3_ROOTS = ["s3://bucket"]
    path, _ = write(roots.datasets / "a.bin", b"a" * 10)
    job = make_job(team, {"name": "a", "uri": file_uri(path), "bytes": 10})
    Job.objects.filter(id=job.id).update(output_uri="s3://bucket/audio/run")
    job = stage(job)
    assert job.end_reason == "staging_failed" and "output.uri" in job.end_detail
    assert "not under the team's prefix" in job.end_detail and not job.allocations.exists()


def test_a_symlink_planted_after_submission_is_refused(roots, team):
    path, _ = write(roots.datasets / "d.bin", b"d" * 10)
    job = make_job(team, {"name": "d", "uri": file_uri(path), "bytes": 10})
    write(roots.outside / "secret.txt", b"s" * 10)
    path.unlink()
    path.symlink_to(roots.outside / "secret.txt")
    job = stage(job)
    assert job.end_reason == "staging_failed" and "not under an allowed data root" in job.end_detail
    assert not (roots.staging / str(job.id)).exists()


def test_a_symlink_that_stays_inside_the_roots_is_followed(roots, team):
    target, _ = write(roots.datasets / "real.bin", b"r" * 10)
    (roots.datasets / "alias.bin").symlink_to(target)
    job = stage(make_job(team, {"name": "r", "uri": file_uri(roots.datasets / "alias.bin"), "bytes": 10}))
    assert job.state == "queued"


def test_a_file_with_another_hard_link_is_refused_unless_the_operator_allows_it(roots, team, settings):
    outside, _ = write(roots.outside / "secret.txt", b"s" * 10)
    os.link(outside, roots.datasets / "innocent.bin")  # the other name lies outside the roots
    spec = {"name": "i", "uri": file_uri(roots.datasets / "innocent.bin"), "bytes": 10}
    job = stage(make_job(team, spec))
    assert job.end_reason == "staging_failed" and "2 hard links" in job.end_detail
    settings.E31_ALLOW_HARDLINKED_SOURCES = True
    assert stage(make_job(team, spec)).state == "queued"


def test_a_fifo_or_a_directory_is_refused_without_blocking(roots, team):
    os.mkfifo(roots.datasets / "pipe")
    (roots.datasets / "dir").mkdir()
    for name in ("pipe", "dir"):
        job = stage(make_job(team, {"name": name, "uri": file_uri(roots.datasets / name), "bytes": 1}))
        assert job.end_reason == "staging_failed" and "not a regular file" in job.end_detail


def test_a_local_http_source_is_refused_by_default(roots, team, server):
    write(server.root / "x.bin", b"x" * 10)
    job = stage(make_job(team, {"name": "x", "uri": server.url("x.bin"), "bytes": 10}))
    assert job.end_reason == "staging_failed"
    assert "127.0.0.1, a loopback, link-local or private address: refused" in job.end_detail
    assert server.requests == []  # refused before any connection


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "127.8.9.10", "::1", "10.0.0.5", "172.16.3.4", "192.168.1.1", "169.254.1.1", "fe80::1",
     "fc00::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "2002:7f00:1::1", "100.64.0.1", "224.0.0.1",
     "64:ff9b::a9fe:101", "64:ff9b::a00:5", "::a00:5", "64:ff9b:1::a00:5", "fec0::1"],
)  # fmt: skip
def test_loopback_link_local_private_and_special_addresses_are_refused(address, monkeypatch):
    """An IPv4 address carried in IPv6 is judged as itself: on an IPv6-only pool with NAT64, a data host
    whose AAAA record is 64:ff9b::a9fe:101 would otherwise reach 169.254.1.1, a link-local address (the cloud
    metadata service's are refused even where private sources are allowed: tests/security/test_platform_services.py)."""
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: [(0, 0, 0, "", (address, 80))])
    with pytest.raises(transfers.TransferFailed, match="refused"):
        sources.checked_addresses("data.example", 80, allow_private=False)
    assert sources.checked_addresses("data.example", 80, allow_private=True) == [address]


@pytest.mark.parametrize("address", ["93.184.215.14", "2606:4700::1111", "8.8.8.8", "64:ff9b::808:808"])
def test_public_addresses_are_allowed(address, monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: [(0, 0, 0, "", (address, 80))])
    assert sources.checked_addresses("data.example", 80, allow_private=False) == [address]


def test_a_name_with_any_private_address_among_its_addresses_is_refused(monkeypatch):
    answers = [(0, 0, 0, "", ("93.184.215.14", 80)), (0, 0, 0, "", ("10.1.2.3", 80))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: answers)
    with pytest.raises(transfers.TransferFailed, match=r"10\.1\.2\.3"):
        sources.checked_addresses("mixed.example", 80, allow_private=False)


def test_the_stager_connects_to_the_address_it_checked_and_names_the_host(roots, team, server, monkeypatch):
    """No second DNS answer: data.example exists only in the answer that was checked."""
    real = socket.getaddrinfo
    seen = []

    def resolve(host, *args, **kwargs):
        seen.append(host)
        return (
            [(0, 0, 0, "", ("127.0.0.1", server.port))]
            if host == "data.example"
            else real(host, *args, **kwargs)
        )

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    monkeypatch.setattr(pinned, "is_public", lambda address: address == "127.0.0.1")  # pretend it is public
    write(server.root / "p.bin", b"p" * 100)
    job = stage(make_job(team, {"name": "p", "uri": server.url("p.bin", host="data.example"), "bytes": 100}))
    assert job.state == "queued", job.end_detail
    assert {r["host"] for r in server.requests} == {f"data.example:{server.port}"}
    assert seen.count("data.example") == len(server.requests)  # one checked answer per connection


def test_a_name_is_tried_at_each_of_its_checked_addresses(roots, team, server, private_ok, monkeypatch):
    real = socket.getaddrinfo
    both = [(0, 0, 0, "", ("::1", server.port)), (0, 0, 0, "", ("127.0.0.1", server.port))]
    monkeypatch.setattr(
        socket, "getaddrinfo", lambda h, *a, **k: both if h == "two.example" else real(h, *a, **k)
    )
    write(server.root / "l.bin", b"l" * 10)  # the server listens on 127.0.0.1 only, not ::1
    job = stage(make_job(team, {"name": "l", "uri": server.url("l.bin", host="two.example"), "bytes": 10}))
    assert job.state == "queued", job.end_detail


def test_a_redirect_to_a_private_address_is_refused(roots, team, server, monkeypatch):
    real = socket.getaddrinfo
    names = {"public.example": "127.0.0.1", "inside.example": "10.1.2.3"}

    def resolve(host, port, *args, **kwargs):
        return [(0, 0, 0, "", (names[host], port))] if host in names else real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    monkeypatch.setattr(pinned, "is_public", lambda address: address == "127.0.0.1")
    server.redirects["r.bin"] = f"http://inside.example:{server.port}/x.bin"
    job = stage(make_job(team, {"name": "r", "uri": server.url("r.bin", host="public.example"), "bytes": 10}))
    assert job.end_reason == "staging_failed" and "10.1.2.3" in job.end_detail


def test_a_redirect_to_another_scheme_is_refused(roots, team, server, private_ok):
    server.redirects["r.bin"] = "file:///etc/passwd"
    job = stage(make_job(team, {"name": "r", "uri": server.url("r.bin"), "bytes": 10}))
    assert job.end_reason == "staging_failed" and "only http and https" in job.end_detail


@pytest.mark.parametrize(
    "uri", ["https://example.com:99999/x", "https://example.com:abc/x", "https://[::1/x"]
)
def test_an_input_no_request_can_go_to_fails_staging_instead_of_stopping_the_stager(roots, team, uri):
    """Stored before intake read the port: its ValueError stopped the stager and left the job staging."""
    job = stage(make_job(team, {"name": "a", "uri": uri, "bytes": 1}))
    assert (job.state, job.end_reason) == ("ended", "staging_failed")
    assert "not a valid URL" in job.end_detail


@pytest.mark.parametrize("location", ["http://127.0.0.1:99999/x.bin", "http://[::1/x.bin"])
def test_a_redirect_no_request_can_go_to_fails_staging(roots, team, server, private_ok, location):
    server.redirects["r.bin"] = location
    job = stage(make_job(team, {"name": "r", "uri": server.url("r.bin"), "bytes": 10}))
    assert job.end_reason == "staging_failed" and "valid URL" in job.end_detail


@pytest.mark.parametrize("where", ["declared", "redirect"])
def test_a_host_name_no_resolver_takes_fails_staging_instead_of_stopping_the_stager(
    roots, team, server, private_ok, where
):
    """A host with a 64-character label (stored before intake checked labels), or a redirect to ``a..b``: the
    resolver raises instead of answering, and the job ends staging_failed saying why, not left staging."""
    if where == "declared":
        uri = "http://" + "a" * 64 + ".example.com/x.bin"
    else:
        server.redirects["r.bin"] = "http://a..b/x.bin"
        uri = server.url("r.bin")
    job = stage(make_job(team, {"name": "r", "uri": uri, "bytes": 10}))
    assert (job.state, job.end_reason) == ("ended", "staging_failed")
    assert "invalid host name" in job.end_detail
