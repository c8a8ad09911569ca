"""A job that fills its attempt space, where job.log lives too, still has its whole log in the database."""

import sys
import tempfile
from pathlib import Path

import pytest
from django.utils import timezone

from jobs import agent, attempt_space, rental, sandbox, trees
from jobs.models import LogChunk
from tests.factories import JobFactory, NodeFactory


class _Output:
    """The job's stdout as the agent reads it: one read per line the job printed."""

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = list(lines)

    def read1(self, size: int) -> bytes:
        return self.lines.pop(0) if self.lines else b""


def test_a_job_that_fills_its_space_keeps_logging_to_the_database():
    """A careless job fills its attempt space (scratch files), which is also where ``job.log`` lives, then
    keeps printing: the training goes on, or it prints the traceback that explains the failure. The first
    failed write to job.log makes ``LogCapture._keep`` mark the log capped at its cap, and from then on
    nothing more reaches the database either: the log the user reads stops at the moment the disk filled
    and says it was "capped at E31_LOG_CAP_BYTES" though it is far below. The design says a full attempt
    disk must not lose the log in the database. (/dev/full stands for the full space: every write fails.)"""
    lines = [f"step {step:04d} loss 0.123456789 after the disk filled\n".encode() for step in range(400)]
    lines.append(b"Traceback: OSError: [Errno 28] No space left on device\n")
    capture = agent.LogCapture(_Output(lines), Path("/dev/full"), cap=10_000_000)
    capture.run()  # the last flush onto the full disk is not an error: the database has it all
    shipped = bytearray()
    capture.ship(lambda offset, data: shipped.extend(data))
    assert b"No space left on device" in shipped, "the job's last words never reached the database"
    assert b"".join(lines) in shipped, "the log in the database stops where the disk filled"
    assert not capture.text().startswith("[log capped"), "a log of 20 KB is said to be capped at 10 MB"


FILL_THEN_TALK = r"""
import os, time
scratch = open(os.path.join(os.environ['HOME'], 'cache.bin'), 'ab', buffering=0)
def fill():
    try:
        while True:
            scratch.write(b'x' * 65536)
    except OSError as exc:
        return exc
print('scratch full:', fill(), flush=True)
for step in range(3000):
    fill()  # its data loader keeps caching to disk, and keeps failing
    print(f'step {step:04d} still training, loss 0.12345 ' + '.' * 60, flush=True)
    if step % 200 == 0:
        time.sleep(0.02)
print('THE LAST LINE', flush=True)
"""


@pytest.mark.django_db(transaction=True)
def test_a_job_that_fills_its_bounded_space_loses_no_log_line_in_the_database(settings):
    """The same, through ``run_part`` and a real loop-mounted space: the job fills its scratch (``$HOME``, in
    the attempt space that also holds job.log), then prints 3,000 more lines while its data loader keeps
    trying to cache to disk, and exits 0. Every line must be in the job's log in the database, as the log
    came nowhere near E31_LOG_CAP_BYTES; today it stops a few dozen lines after the disk filled."""
    state = Path(tempfile.mkdtemp(prefix="e31-review-"))
    settings.E31_AGENT_ROOT = state / "agents"
    settings.E31_SCRATCH_BYTES = 2**20
    settings.E31_LOG_CAP_BYTES = 2**20
    node = NodeFactory(name="gpu-rv", limits="none: review; disk bounded")
    job = JobFactory(argv=[sys.executable, "-c", FILL_THEN_TALK])
    assert rental.rent_job(job_id=job.id, gpus_by_node={node.name: (0,)}, now=timezone.now())
    try:
        agent.run_part(allocation_id=job.allocations.get().id, mode=sandbox.UNSANDBOXED, uids=None)
        job.refresh_from_db()
        chunks = LogChunk.objects.filter(job=job).order_by("offset").values_list("data", flat=True)
        log = b"".join(bytes(chunk) for chunk in chunks)
        assert b"scratch full" in log
        assert b"THE LAST LINE" in log, f"the database log stops at: {log[-200:]!r}"
    finally:
        attempt_space.release_all(state)
        trees.remove_tree(state)
