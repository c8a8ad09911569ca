"""Whole logs in the database: appended by the agent, read from an offset, followed with a bounded wait."""

import io
import os
import threading
import time

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs import agent, logs
from jobs.models import Allocation, JobEvent, LogChunk
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(team):
    job = JobFactory(team=team, state="running", attempt=1)
    allocation = Allocation.objects.create(
        job=job, attempt=1, node=NodeFactory(), gpu_indices=[0], rented_at=timezone.now()
    )
    return job, allocation


@pytest.fixture
def api(member_client, member_token):
    member_client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {member_token}"
    return member_client


def test_the_whole_log_is_read_back_from_any_offset_and_a_resent_piece_is_stored_once(running):
    job, _ = running
    text = "".join(f"step {i}\n" for i in range(100_000)).encode()  # ~1.2 MB: several chunks, two reads
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=text)
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=text[: logs.CHUNK_BYTES])
    first = logs.read_log(job, attempt=0, rank=0, offset=0)
    second = logs.read_log(job, attempt=0, rank=0, offset=first.next_offset)
    assert (first.text + second.text).encode() == text and not second.complete
    middle = logs.read_log(job, attempt=1, rank=0, offset=300_001)
    assert middle.text.encode() == text[300_001 : 300_001 + logs.READ_BYTES]


def test_a_resend_that_carries_more_bytes_keeps_them_all(running):
    # The first send committed but its reply was lost; the agent resends from the same offset with
    # what it wrote since: the longer resend's extra bytes must not be dropped.
    job, _ = running
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=b"epoch 1\n")
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=b"epoch 1\nepoch 2\n")
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=16, data=b"epoch 3\n")
    assert b"".join(logs.log_bytes(job, attempt=1, rank=0)) == b"epoch 1\nepoch 2\nepoch 3\n"
    assert logs.read_log(job, attempt=1, rank=0, offset=0).next_offset == 24


def test_a_character_cut_between_two_shipments_is_held_back_until_it_is_whole(running):
    job, _ = running
    data = "loss → 0.1\n".encode()
    cut = data.index("→".encode()) + 1
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=data[:cut])
    early = logs.read_log(job, attempt=1, rank=0, offset=0)
    assert early.text == "loss " and early.next_offset == cut - 1
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=cut, data=data[cut:])
    assert logs.read_log(job, attempt=1, rank=0, offset=early.next_offset).text == "→ 0.1\n"


def test_the_log_is_complete_once_the_part_has_exited(running):
    job, allocation = running
    assert not logs.read_log(job, attempt=1, rank=0, offset=0).complete
    Allocation.objects.filter(id=allocation.id).update(finished_at=timezone.now())
    assert logs.read_log(job, attempt=1, rank=0, offset=0).complete


def test_a_finished_log_longer_than_one_read_is_complete_only_once_read_to_its_end(running):
    job, allocation = running
    text = "".join(f"step {i}\n" for i in range(150_000)).encode()  # ~1.8 MB: two reads
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=text)
    Allocation.objects.filter(id=allocation.id).update(finished_at=timezone.now())
    first = logs.read_log(job, attempt=1, rank=0, offset=0)
    assert first.next_offset < len(text) and not first.complete  # a follower told `complete` would stop here
    rest = logs.read_log(job, attempt=1, rank=0, offset=first.next_offset)
    assert (first.text + rest.text).encode() == text and rest.complete


def test_the_agent_ships_everything_it_writes_and_notes_the_cap(tmp_path):
    stream = io.BufferedReader(io.BytesIO(b"x" * 5000 + b"tail\n"))
    capture = agent.LogCapture(stream, tmp_path / "job.log", cap=4096)
    capture.run()
    sent = []
    capture.ship(lambda offset, data: sent.append((offset, data)))
    capture.ship(lambda offset, data: sent.append((offset, data)))  # nothing new: no second send
    assert len(sent) == 1 and sent[0][0] == 0
    assert sent[0][1] == (tmp_path / "job.log").read_bytes()
    assert sent[0][1].startswith(b"x" * 4096) and b"[log capped at 4096 bytes" in sent[0][1]


def test_past_the_cap_the_agent_reads_a_jobs_output_no_faster_than_its_pace(tmp_path, monkeypatch):
    """A job writing to stdout at full speed kept its agent reading, masking and keeping the tail of 1.4 GB/s
    after its log was capped: 6.5 s of the agent's CPU in 10 s, taken from every other team's parts on the node.
    Past the cap the agent reads at POST_CAP_BYTES_PER_S, and the full pipe holds the job's writes back."""
    monkeypatch.setattr(agent, "POST_CAP_BYTES_PER_S", 1 << 20)
    read_fd, write_fd = os.pipe()
    capture = agent.LogCapture(os.fdopen(read_fd, "rb"), tmp_path / "job.log", cap=4096)
    capture.start()
    began = time.monotonic()
    with os.fdopen(write_fd, "wb") as job_stdout:
        for _ in range(32):  # 2 MiB past the cap
            job_stdout.write(b"x" * 65536)
    capture.join(timeout=30)
    took = time.monotonic() - began
    assert not capture.is_alive() and capture.capped
    assert took >= 1.5, f"2 MiB past the cap read in {took:.2f} s"
    assert capture.text().endswith("x" * 100)  # the tail still shows the latest output


def test_a_job_printing_past_the_cap_is_not_held_back_for_long_at_the_default_pace(tmp_path):
    """Reproduction: a job printing 26 MB (0.16 s of work) past a 10 MB cap was held back by its own writes at
    256 KB/s, ran 37 s of metered GPU time and timed out. 16 MiB past the cap now take about 2 s."""
    read_fd, write_fd = os.pipe()
    capture = agent.LogCapture(os.fdopen(read_fd, "rb"), tmp_path / "job.log", cap=4096)
    capture.start()
    began = time.monotonic()
    with os.fdopen(write_fd, "wb") as job_stdout:
        for _ in range(256):
            job_stdout.write(b"y" * 65535 + b"\n")
    capture.join(timeout=60)
    assert not capture.is_alive() and capture.capped
    assert time.monotonic() - began < 6
    assert capture.text().endswith("y" * 100 + "\n")


def test_a_last_shipment_does_not_wait_for_ever_behind_one_the_network_swallowed(tmp_path):
    """A late check of the watcher can hang in its shipment for as long as TCP waits: the part's last shipment,
    and so its release, waited behind it. It gives up after ``wait_s`` and keeps the bytes."""
    capture = agent.LogCapture(io.BufferedReader(io.BytesIO(b"hello\n")), tmp_path / "job.log", cap=100)
    capture.run()
    swallowed, stop = threading.Event(), threading.Event()

    def hanging(offset, data):
        swallowed.set()
        stop.wait(10)

    late = threading.Thread(target=capture.ship, args=(hanging,))
    late.start()
    swallowed.wait(5)
    sent, began = [], time.monotonic()
    try:
        assert capture.ship(lambda offset, data: sent.append((offset, data)), wait_s=0.2) is True
        assert time.monotonic() - began < 2 and sent == []
    finally:
        stop.set()
        late.join()


def test_a_failed_shipment_is_kept_and_sent_again_from_the_same_offset(tmp_path):
    capture = agent.LogCapture(io.BufferedReader(io.BytesIO(b"hello\n")), tmp_path / "job.log", cap=100)
    capture.run()

    def down(offset, data):
        raise ConnectionError("database restarting")

    with pytest.raises(ConnectionError):
        capture.ship(down)
    sent = []
    capture.ship(lambda offset, data: sent.append((offset, data)))
    assert sent == [(0, b"hello\n")]


def test_the_api_reads_the_log_and_another_team_gets_a_404(api, running, outsider_client):
    job, _ = running
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=b"epoch 1\nepoch 2\n")
    body = api.get(f"/api/v1/jobs/{job.id}/log", {"offset": 8}).json()
    assert (body["text"], body["next_offset"], body["attempt"], body["ranks"]) == ("epoch 2\n", 16, 1, 1)
    assert outsider_client.get(f"/api/v1/jobs/{job.id}/log").status_code == 404
    assert outsider_client.get(reverse("jobs:log", args=[job.id])).status_code == 404


@pytest.mark.parametrize(
    "query, said",
    [
        ({"attempt": 2}, "no attempt 2: job {id} has had 1"),
        ({"rank": 1}, "attempt 1 of job {id} ran on 1 node: rank 0 only"),
    ],
)
def test_a_log_that_never_existed_is_a_404_not_an_empty_complete_log(api, running, query, said):
    """A user follows attempt 2, or rank 1, of a job that ran once on one node (a typo, or a script that
    guessed): the answer was an empty log marked complete, as if the part had run and printed nothing,
    and on a running job a follower that waited for ever. It is a 404 that says what exists."""
    job, _ = running
    answer = api.get(f"/api/v1/jobs/{job.id}/log", {**query, "wait": 1})
    assert answer.status_code == 404
    assert said.format(id=job.id) in answer.json()["detail"]


@pytest.mark.django_db(transaction=True)
def test_a_follower_waits_for_new_text_and_gets_it_as_soon_as_it_is_written(running):
    job, _ = running
    timer = threading.Timer(
        1.0, logs.append_log, kwargs=dict(job_id=job.id, attempt=1, rank=0, offset=0, data=b"late\n")
    )
    began = time.monotonic()
    timer.start()
    piece, retry_after = logs.follow_log(job, attempt=0, rank=0, offset=0, wait_s=10)
    took = time.monotonic() - began
    assert piece.text == "late\n" and retry_after == 0 and 0.9 < took < 5


def test_followers_past_the_per_process_limit_are_told_to_come_back_instead_of_holding_a_thread(
    running, monkeypatch
):
    job, _ = running
    monkeypatch.setattr(logs, "_WAITERS", threading.BoundedSemaphore(1))
    logs._WAITERS.acquire()  # one follower already waiting in this process
    began = time.monotonic()
    piece, retry_after = logs.follow_log(job, attempt=0, rank=0, offset=0, wait_s=10)
    assert time.monotonic() - began < 1 and retry_after == logs.BUSY_RETRY_S and piece.text == ""


def test_the_job_page_offers_the_whole_log_as_a_download(member_client, running):
    job, _ = running
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=b"a" * 300_000 + b"\nend\n")
    page = member_client.get(reverse("jobs:detail", args=[job.id])).content.decode()
    assert f"{reverse('jobs:log', args=[job.id])}?attempt=1&amp;rank=0" in page
    response = member_client.get(reverse("jobs:log", args=[job.id]), {"attempt": 1, "rank": 0})
    assert b"".join(response.streaming_content) == b"a" * 300_000 + b"\nend\n"
    assert response["Content-Disposition"] == f'attachment; filename="job-{job.id}-attempt-1-rank-0.log"'
    assert LogChunk.objects.filter(job=job).count() == 2


def _log_box(client, job) -> str:
    page = client.get(reverse("jobs:detail", args=[job.id])).content.decode()
    start = page.index(f'id="job-{job.id}-log">') + len(f'id="job-{job.id}-log">')
    return page[start : page.index("</pre>", start)]


def test_an_ended_job_that_never_ran_says_so_and_why_in_its_log_box(member_client, team):
    job = JobFactory(
        team=team, state="ended", end_reason="staging_failed", end_detail="corpus: 404 Not Found"
    )
    assert _log_box(member_client, job) == (
        "(no output: the job never ran; it ended staging failed before starting: corpus: 404 Not Found)"
    )


def test_the_log_box_of_a_job_without_output_says_yet_only_while_it_lives(member_client, team, running):
    job, _ = running
    assert _log_box(member_client, job) == "(no output yet)"
    ran = JobFactory(team=team, state="released", end_reason="succeeded")
    JobEvent.objects.create(job=ran, from_state="rented", to_state="running", at=timezone.now(), attempt=1)
    assert _log_box(member_client, ran) == "(no output)"


def _tail_of(output: bytes, tmp_path) -> str:
    capture = agent.LogCapture(
        io.BufferedReader(io.BytesIO(output), buffer_size=997), tmp_path / "job.log", cap=10**7
    )
    capture.run()
    return capture.text()


def test_the_job_page_tail_starts_on_a_whole_line_and_counts_the_lines_above_it(tmp_path):
    text = _tail_of("".join(f"line {i}\n" for i in range(5000)).encode(), tmp_path)
    first, second, *rest = text.splitlines()
    kept = int(second.removeprefix("line "))
    assert first == f"… {kept} earlier lines"
    assert [second, *rest] == [f"line {i}" for i in range(kept, 5000)]


def test_a_short_log_is_shown_whole_with_no_note(tmp_path):
    assert _tail_of(b"hello\nworld\n", tmp_path) == "hello\nworld\n"


def test_one_earlier_line_is_counted_in_the_singular(tmp_path):
    window = b"second\n" + b"y" * (agent.TAIL_BYTES - 8) + b"\n"  # exactly the tail's size
    assert _tail_of(b"first\n" + window, tmp_path) == "… 1 earlier line\n" + window.decode()
