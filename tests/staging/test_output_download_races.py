"""A member who can write in the team's output folder swaps a folder of a delivered output for a link (or the file
for a FIFO) between the console's check of the path and its open: the download answers 404, never another team's
bytes, never a 500, and never hangs a worker on a FIFO.

Each swap is made at a fixed step of the download (just before the console opens the file, or anything under the
team's output folder), so the race is won every time, not by chance."""

import contextlib
import io
import os
import threading

import pytest
from django.utils import timezone

from jobs.models import OutputFile
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def planted(roots, team):
    """A delivered ``d/x.txt`` of the team's job; audio's ``results/x.txt`` beside it in the output root."""
    secret = roots.output_root / "audio" / "results" / "x.txt"
    secret.parent.mkdir(parents=True)
    secret.write_bytes(b"AUDIO-SECRET")
    job = JobFactory(team=team, state="released", end_reason="succeeded", attempt=1, sealed_files=1,
                     output_uri=f"file://{roots.outputs}/run", delivery_state="delivered",
                     delivered_at=timezone.now())  # fmt: skip
    OutputFile.objects.create(job=job, attempt=1, path="d/x.txt", bytes=4, sha256="0" * 64)
    folder = roots.outputs / "run" / f"{job.id}-1"
    (folder / "d").mkdir(parents=True)
    (folder / "d" / "x.txt").write_bytes(b"mine")
    job.folder, job.secret = folder, secret
    return job


@pytest.fixture(params=["page", "api"])
def download(request, member_client, member_token):
    """GET one output through the job page's link or the API; an exception in the view is a 500, not raised."""
    member_client.raise_request_exception = False
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {member_token}"}

    def get(job, path):
        if request.param == "page":
            response = member_client.get(f"/jobs/{job.id}/outputs/download/", {"path": path})
        else:
            response = member_client.get(f"/api/v1/jobs/{job.id}/outputs/download", {"path": path}, **bearer)
        body = b"".join(response.streaming_content) if response.status_code == 200 else b""
        return response.status_code, body

    return get


@contextlib.contextmanager
def swap_when(monkeypatch, opening, swap):
    """Runs ``swap`` once, just before the first open (``os.open`` or ``io.open``, as ``Path.open`` does) for
    which ``opening(path)`` holds; yields the list that records whether it ran."""
    done = []
    real_os_open, real_io_open = os.open, io.open

    def hook(path):
        if not done and isinstance(path, str | os.PathLike) and opening(os.fspath(path)):
            done.append(True)
            swap()

    def os_open(path, *args, **kwargs):
        hook(path)
        return real_os_open(path, *args, **kwargs)

    def io_open(file, *args, **kwargs):
        hook(file)
        return real_io_open(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(io, "open", io_open)
    yield done
    monkeypatch.setattr(os, "open", real_os_open)
    monkeypatch.setattr(io, "open", real_io_open)


def link_in_place_of_d(job):
    def swap():
        (job.folder / "d").rename(job.folder / "d.moved")
        (job.folder / "d").symlink_to(job.secret.parent)

    return swap


def test_a_folder_swapped_for_a_link_once_the_path_was_checked_is_a_404(
    planted, download, roots, monkeypatch
):
    """The swap comes just before the console's first open under the team's output folder, after every check
    it makes on the path by name (the old check: ``realpath`` under the folder, then ``is_file``)."""
    under_team = str(roots.outputs)
    with swap_when(monkeypatch, lambda p: p.startswith(under_team), link_in_place_of_d(planted)) as swapped:
        status, body = download(planted, "d/x.txt")
    assert swapped
    assert (status, body) == (404, b"")


def test_a_folder_swapped_as_the_file_itself_is_opened_still_reads_the_teams_own_file(
    planted, download, monkeypatch
):
    """The swap comes just before the file's own name is opened: the folder the console opened is the one read
    from, wherever it has been moved, never the link that now stands in its place."""
    with swap_when(monkeypatch, lambda p: p.endswith("x.txt"), link_in_place_of_d(planted)) as swapped:
        status, body = download(planted, "d/x.txt")
    assert swapped
    assert (status, body) == (200, b"mine")


def test_a_fifo_swapped_in_for_the_file_is_a_404_at_once(planted, download, monkeypatch):
    """Opened blocking, a FIFO would hold the worker until someone writes to it: a rescuer opens its other end
    after 5 s, so the old behaviour fails this test instead of hanging the run."""
    fifo = planted.folder / "d" / "x.txt"

    def swap():
        fifo.unlink()
        os.mkfifo(fifo)

    def rescue():
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            rescued.append(True)

    rescued = []
    rescuer = threading.Timer(5, rescue)
    rescuer.start()
    try:
        with swap_when(monkeypatch, lambda p: p.endswith("x.txt"), swap) as swapped:
            status, _ = download(planted, "d/x.txt")
    finally:
        rescuer.cancel()
        rescuer.join()
    assert swapped and not rescued
    assert status == 404


def test_a_fifo_or_a_folder_at_the_path_is_a_404(planted, download):
    os.mkfifo(planted.folder / "fifo")
    OutputFile.objects.create(job=planted, attempt=1, path="fifo", bytes=4, sha256="0" * 64)
    OutputFile.objects.create(job=planted, attempt=1, path="d", bytes=4, sha256="0" * 64)
    assert download(planted, "fifo") == (404, b"")
    assert download(planted, "d") == (404, b"")


def test_a_folder_of_the_attempt_that_is_a_link_at_all_is_a_404(planted, download):
    (planted.folder / "d").rename(planted.folder / "d.moved")
    (planted.folder / "d").symlink_to(planted.secret.parent)
    assert download(planted, "d/x.txt") == (404, b"")
