"""What a job writes cannot make its node agent misbehave: a NUL in its log, a file name of bytes that are no
text, an output nested deeper than a walk recurses. Each attempt ends as the job's own outcome, its GPUs freed."""

import io
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django.db import DatabaseError
from django.utils import timezone

from jobs import agent, limits, rental, sandbox, trees
from jobs.models import GpuHold, Job, LogChunk
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rented(settings, tmp_path, monkeypatch):
    """A job rented on an unsandboxed node (its space unbounded: no loop mounts here)."""
    settings.E31_AGENT_ROOT = tmp_path / "agents"
    monkeypatch.setattr(limits, "bound_space", lambda root, job: False)
    node = NodeFactory(name="gpu-h1", limits="none")

    def rent(**fields):
        job = JobFactory(**fields)
        assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: (0,)}, now=timezone.now())
        return job

    return rent


def _run(job):
    agent.run_part(allocation_id=job.allocations.get().id, mode=sandbox.UNSANDBOXED, uids=None)
    job.refresh_from_db()


def _log(job) -> bytes:
    return b"".join(bytes(chunk) for chunk in LogChunk.objects.filter(job=job).values_list("data", flat=True))


def test_a_nul_byte_in_a_jobs_output_is_kept_in_its_log_and_the_attempt_ends_as_the_jobs(rented):
    job = rented(argv=[sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'before\\x00after\\n')"])
    _run(job)
    assert (job.state, job.end_reason) == ("released", "succeeded"), job.end_detail
    assert _log(job) == b"before\x00after\n"
    assert job.log_tail == "before\ufffdafter\n"
    assert not GpuHold.objects.filter(active=True).exists()


def test_a_nul_byte_in_the_tail_does_not_stop_the_log_and_the_heartbeat_while_the_job_runs(rented, tmp_path):
    """Each check stores the tail, ships the log and says the agent is alive: a tail PostgreSQL refused failed
    every check until 8 KiB more output pushed the NUL out, and a quiet job was abandoned as lost meanwhile."""
    job = rented()
    allocation_id = job.allocations.get().id
    assert rental.start_allocation(allocation_id=allocation_id, now=timezone.now())
    part = agent._load_part(allocation_id, sandbox.UNSANDBOXED, None)
    capture = agent.LogCapture(io.BytesIO(b"step 1\x00\nstep 2\n"), tmp_path / "job.log", 10_000)
    capture.run()
    Job.objects.filter(id=job.id).update(worker_seen_at=None)
    try:
        agent._keep_up(part, capture, seen=True, until=time.monotonic() + 1)
    except DatabaseError:
        pytest.fail("the check failed on the tail")
    job.refresh_from_db()
    assert job.worker_seen_at is not None
    assert _log(job) == b"step 1\x00\nstep 2\n"


WRITE_A_NAME_OF_BYTES = (
    "import os; d = os.environ['E31_OUTPUT_DIR'].encode();"
    "open(os.path.join(d, b'bad-\\xff-name.txt'), 'wb').write(b'x');"
    "open(os.path.join(d, b'good.txt'), 'wb').write(b'y')"
)


def test_an_output_file_named_with_bytes_that_are_no_text_is_refused_and_the_attempt_ends(rented):
    """It raised storing the manifest, between the job's exit and its seal: the job stayed in OUTPUT, its GPUs
    held and its meter on, until the reconciler ended it as lost (and requeued it, to do the same again)."""
    job = rented(argv=[sys.executable, "-c", WRITE_A_NAME_OF_BYTES], output_bytes=100)
    _run(job)
    assert (job.state, job.end_reason) == ("released", "output_failed")
    assert job.end_detail == r"output not delivered: a file's name is not UTF-8 text: b'bad-\xff-name.txt'"
    assert not GpuHold.objects.filter(active=True).exists()


def test_an_output_nested_past_what_a_walk_recurses_is_refused_not_raised():
    root = Path(tempfile.mkdtemp(prefix="e31-deep-"))  # not pytest's tmp_path: its clean-up recurses too
    output = root / "output"
    output.mkdir()
    folder = os.open(output, os.O_RDONLY)
    try:
        for _ in range(1500):  # relative to a descriptor, as a job can: no path length limit
            os.mkdir("d", dir_fd=folder)
            deeper = os.open("d", os.O_RDONLY, dir_fd=folder)
            os.close(folder)
            folder = deeper
        os.close(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=folder))
    finally:
        os.close(folder)
    try:
        sealed = agent.seal(output, declared_bytes=100, max_files=10)
    finally:
        trees.remove_tree(root)
    assert sealed == agent.Sealed([], "nests its folders too deep to be sealed (about a thousand levels)")


def hide_past_the_longest_path(root: Path, *, size: int) -> None:
    """A file of ``size`` bytes (sparse) seventeen folders of 250 characters down: its path is longer than PATH_MAX
    (4,096), so a walk by path cannot list the folders it lies in. A job makes it relative to a descriptor."""
    folder = os.open(root, os.O_RDONLY)
    try:
        for _ in range(17):
            os.mkdir("x" * 250, dir_fd=folder)
            deeper = os.open("x" * 250, os.O_RDONLY, dir_fd=folder)
            os.close(folder)
            folder = deeper
        hidden = os.open("hidden.bin", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=folder)
        os.truncate(hidden, size)
        os.close(hidden)
    finally:
        os.close(folder)


def test_an_output_hidden_past_the_longest_path_is_refused_not_left_out(tmp_path):
    """Reproduction: 5 GiB seventeen folders of 250 characters down, and 100 bytes at the top; the seal listed only
    the 100 bytes (os.walk leaves out, silently, a folder it cannot list), under a declaration of 1,000."""
    output = tmp_path / "output"
    output.mkdir()
    (output / "small").write_bytes(b"x" * 100)
    hide_past_the_longest_path(output, size=5 << 30)
    sealed = agent.seal(output, declared_bytes=1000, max_files=10)
    assert sealed.files == [] and "could not be read" in sealed.refused, sealed


NEST_1500_FOLDERS = (
    "import os; fd = os.open(os.environ['E31_OUTPUT_DIR'], os.O_RDONLY)\n"
    "for _ in range(1500):\n"
    "    os.mkdir('d', dir_fd=fd); inner = os.open('d', os.O_RDONLY, dir_fd=fd); os.close(fd); fd = inner\n"
    "os.close(os.open('leaf', os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))\n"
)


def test_an_output_nested_past_what_a_walk_recurses_ends_as_the_jobs_outcome_not_the_agents_failure(
    rented, settings
):
    """Reproduction: a job nested 1,500 folders in its output and exited 0; giving its files back to the agent
    raised RecursionError after the job, so the attempt ended as "the node agent failed", with a traceback in the
    agent's log, as though the node were at fault."""
    job = rented(argv=[sys.executable, "-c", NEST_1500_FOLDERS], output_bytes=100)
    try:
        _run(job)
    finally:
        trees.remove_tree(settings.E31_AGENT_ROOT)  # before pytest's own clean-up, which recurses
    assert (job.state, job.end_reason) == ("released", "output_failed"), job.end_detail
    assert "nests its folders too deep" in job.end_detail
    assert not GpuHold.objects.filter(active=True).exists()


def test_a_too_long_paths_name_reaches_the_job_page_cli_and_mail_inert(tmp_path):
    """The refusal quoted the job's own file name raw: a C1 control in it (U+009D, a terminal's OSC) reached the
    job's end detail, and from there `e31 show`, and a newline in it forged a line of the failure e-mail."""
    output = tmp_path / "output"
    folder = output / ("d" * 200) / ("e" * 200) / ("f" * 200) / ("g" * 200) / ("h" * 200)
    folder.mkdir(parents=True)
    (folder / "\x9d52;c;cHduZWQ=\x9c\nSee evil.example for your results").write_bytes(b"x")
    sealed = agent.seal(output, declared_bytes=1000, max_files=10)
    assert "longer than" in sealed.refused and sealed.refused.isprintable(), sealed.refused


def test_links_and_pipes_in_an_output_are_left_out_by_name_not_silently(tmp_path):
    """A job's "best" checkpoint as a link to its epoch file, a "latest" link to a folder, a FIFO: the seal left
    them out (a link may lead to a host file: never an output), and said nothing; the team found them missing."""
    output = tmp_path / "output"
    (output / "run").mkdir(parents=True)
    (output / "epoch_10.pt").write_bytes(b"w" * 10)
    (output / "run" / "a.txt").write_bytes(b"a")
    (output / "best.pt").symlink_to("epoch_10.pt")
    (output / "latest").symlink_to("run", target_is_directory=True)
    os.mkfifo(output / "pipe")
    sealed = agent.seal(output, declared_bytes=1000, max_files=10)
    assert [f["path"] for f in sealed.files] == ["epoch_10.pt", "run/a.txt"] and not sealed.refused
    assert sealed.skipped == ("best.pt", "latest", "pipe")
    assert agent.skipped_note(sealed.skipped) == (
        "not sealed, as not regular files (links, pipes, devices): 'best.pt', 'latest', 'pipe'"
    )
    assert agent.skipped_note(tuple(f"l{n}" for n in range(12))).endswith("'l4' and 7 more")


def test_what_a_seal_left_out_is_told_on_the_jobs_page(rented):
    job = rented(
        argv=[
            sys.executable,
            "-c",
            "import os; os.symlink('/etc/passwd', os.environ['E31_OUTPUT_DIR'] + '/p')",
        ]
    )
    _run(job)
    assert (job.state, job.end_reason) == ("released", "succeeded"), job.end_detail
    assert job.events.filter(reason__contains="not sealed, as not regular files").exists()
