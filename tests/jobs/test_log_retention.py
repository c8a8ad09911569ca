"""Job logs are kept E31_LOG_KEEP_DAYS after the job ends, then removed; the page, the API and `e31 logs` say so.

What the log removal must never touch is checked beside it: a recent job's log, a live job's, the job's
events and its ledger rows (records, kept for ever).
"""

import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from jobs import logs, tasks
from jobs.models import Allocation, Job, JobEvent, LogChunk, OutputFile
from metering.models import MeterEntry
from tests.cli.inprocess import e31
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
REMOVED = (
    "The log was removed on 2026-12-01, 91 days after the job ended: the console keeps job logs 90 days."
)


def _job_with_log(team, member, *, state: str, ended: datetime, text: bytes, **fields) -> Job:
    job = JobFactory(
        team=team, submitted_by=member, state=state, attempt=1, submitted_at=ended - timedelta(hours=2),
        state_changed_at=ended, end_reason="succeeded" if state == "released" else "",
        log_tail=text.decode(), **fields,
    )  # fmt: skip
    allocation = Allocation.objects.create(
        job=job, attempt=1, node=NodeFactory(), gpu_indices=[0], rented_at=ended - timedelta(hours=1),
        started_at=ended - timedelta(hours=1), finished_at=ended if state == "released" else None,
        released_at=ended if state == "released" else None,
    )  # fmt: skip
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=text)
    JobEvent.objects.create(job=job, from_state="rented", to_state="running", at=ended - timedelta(hours=1))
    if state == "released":
        JobEvent.objects.create(job=job, from_state="running", to_state=state, reason="succeeded", at=ended)
        MeterEntry.objects.create(
            allocation=allocation, job=job, team=team, period_start=ended - timedelta(hours=1), period_end=ended,
            gpus=1, microseconds=3600 * 10**6, kind="final", created_at=ended,
        )  # fmt: skip
    return job


@pytest.fixture
def old(team, member):
    """Ended 91 days before NOW: past the 90 days a log is kept."""
    return _job_with_log(team, member, state="released", ended=NOW - timedelta(days=91), text=b"old epoch\n")


@pytest.fixture
def recent(team, member):
    return _job_with_log(
        team, member, state="released", ended=NOW - timedelta(days=89), text=b"recent epoch\n"
    )


@pytest.fixture
def live(team, member):
    """Running since long before the cut-off (a job's clock is its end, not its start)."""
    return _job_with_log(team, member, state="running", ended=NOW - timedelta(days=200), text=b"live epoch\n")


def _log(job: Job) -> bytes:
    return b"".join(logs.log_bytes(job, attempt=1, rank=0))


def test_the_logs_of_jobs_ended_past_the_kept_days_are_removed_and_every_other_log_and_record_is_kept(
    old, recent, live
):
    events, ledger = JobEvent.objects.count(), MeterEntry.objects.count()
    assert logs.prune_logs(now=NOW, keep_days=90) == 1
    old.refresh_from_db()
    assert not LogChunk.objects.filter(job=old).exists() and old.log_tail == "" and old.log_removed_at == NOW
    assert _log(recent) == b"recent epoch\n" and _log(live) == b"live epoch\n"
    assert Job.objects.get(id=recent.id).log_removed_at is None
    assert (JobEvent.objects.count(), MeterEntry.objects.count()) == (events, ledger) == (5, 2)
    assert logs.prune_logs(now=NOW, keep_days=90) == 0  # removed once; the next pass finds nothing


def test_pruning_in_small_batches_removes_each_log_once(team, member):
    for _ in range(3):
        _job_with_log(team, member, state="released", ended=NOW - timedelta(days=100), text=b"x\n")
    assert logs.prune_logs(now=NOW, keep_days=90, batch=1) == 3
    assert not LogChunk.objects.exists()
    assert Job.objects.filter(log_removed_at=NOW).count() == 3


def test_a_job_whose_outputs_are_still_being_delivered_keeps_its_log(team, member):
    # Delivery writes the whole log beside the outputs: it is read from these rows.
    job = _job_with_log(team, member, state="released", ended=NOW - timedelta(days=95), text=b"late\n",
                        delivery_state="delivering")  # fmt: skip
    assert logs.prune_logs(now=NOW, keep_days=90) == 0
    assert _log(job) == b"late\n"


def test_the_job_page_says_the_log_was_removed_and_offers_no_empty_download(member_client, old):
    logs.prune_logs(now=NOW, keep_days=90)
    page = member_client.get(reverse("jobs:detail", args=[old.id])).content.decode()
    assert REMOVED in page
    assert "Whole log:" not in page and reverse("jobs:log", args=[old.id]) not in page
    download = member_client.get(reverse("jobs:log", args=[old.id]), {"attempt": "1", "rank": "0"})
    assert download.status_code == 410 and REMOVED in download.content.decode()


def test_a_kept_log_is_on_the_page_and_in_the_download_as_before(member_client, recent):
    logs.prune_logs(now=NOW, keep_days=90)
    page = member_client.get(reverse("jobs:detail", args=[recent.id])).content.decode()
    assert "recent epoch" in page and "Whole log:" in page and "was removed" not in page
    download = member_client.get(reverse("jobs:log", args=[recent.id]), {"attempt": "1", "rank": "0"})
    assert b"".join(download.streaming_content) == b"recent epoch\n"


def test_the_api_log_answer_says_the_log_was_removed(member_client, member_token, old, recent):
    logs.prune_logs(now=NOW, keep_days=90)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {member_token}"}
    gone = member_client.get(f"/api/v1/jobs/{old.id}/log", {"wait": 5}, **auth).json()
    assert gone["removed"] == REMOVED and gone["text"] == "" and gone["complete"] is True
    kept = member_client.get(f"/api/v1/jobs/{recent.id}/log", **auth).json()
    assert kept["removed"] == "" and kept["text"] == "recent epoch\n"
    schema = member_client.get("/api/v1/openapi.json").json()["components"]["schemas"]["LogOut"]
    assert "removed" in schema["properties"] and schema["properties"]["removed"]["description"]


def test_e31_logs_prints_that_the_log_was_removed(monkeypatch, member_token, old):
    logs.prune_logs(now=NOW, keep_days=90)
    code, stdout, stderr = e31(monkeypatch, member_token, "logs", str(old.id), "--follow")
    assert code == 4 and stdout == ""  # not an empty log: a script must not take it for one
    assert REMOVED in " ".join(stderr.split())  # the terminal may wrap the sentence


def test_e31_outputs_says_the_list_of_files_was_removed_and_where_the_files_are(
    monkeypatch, member_token, old
):
    """It printed an empty table for a job that sealed files: a script downloading them got nothing, and exit 0."""
    _sealed(old, 2)
    logs.prune_logs(now=NOW, keep_days=90)
    code, stdout, stderr = e31(monkeypatch, member_token, "outputs", str(old.id))
    said = " ".join(stderr.split())
    assert code == 4 and stdout == ""
    assert "The list of job" in said and "2 files was removed with its log" in said
    assert f"file:///srv/outputs/demo/run-7/{old.id}-1/" in said.replace(" ", "")


def test_a_job_that_never_ran_is_not_said_to_have_lost_a_log(
    monkeypatch, member_client, member_token, team, member
):
    """A job cancelled in the queue never had a log, but once pruned the API and `e31 logs` said "The log was
    removed … 91 days after the job ended"."""
    ended = NOW - timedelta(days=91)
    job = JobFactory(team=team, submitted_by=member, state="ended", end_reason="cancelled", attempt=0,
                     submitted_at=ended - timedelta(hours=1), state_changed_at=ended)  # fmt: skip
    assert logs.prune_logs(now=NOW, keep_days=90) == 1  # marked, so the pruner's index forgets it
    answer = member_client.get(
        f"/api/v1/jobs/{job.id}/log", HTTP_AUTHORIZATION=f"Bearer {member_token}"
    ).json()
    assert answer["removed"] == "" and answer["text"] == "" and answer["complete"] is True
    code, _, stderr = e31(monkeypatch, member_token, "logs", str(job.id))
    assert code == 0 and "removed" not in stderr, stderr


@pytest.mark.django_db(transaction=True)
def test_a_rerun_of_a_job_whose_log_is_being_removed_is_not_held_up(team, member):
    """The pruner locked its batch FOR UPDATE, which also blocks every insert naming one of those jobs (a re-run's
    rerun_of, a webhook delivery) until the batch's logs, up to 10 MB a part, were deleted."""
    old = _job_with_log(team, member, state="released", ended=NOW - timedelta(days=91), text=b"old epoch\n")
    outcome = []

    def rerun() -> None:
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL lock_timeout = '2s'")
                JobFactory(team=team, submitted_by=member, rerun_of=old)
            outcome.append("inserted")
        except OperationalError as exc:
            outcome.append(str(exc).splitlines()[0])
        finally:
            connections.close_all()

    with transaction.atomic():  # the batch's transaction still open: its row locks held
        assert logs._prune_batch(ids=[old.id], cutoff=NOW - timedelta(days=90), now=NOW) == 1
        thread = threading.Thread(target=rerun)
        thread.start()
        thread.join()
    assert outcome == ["inserted"]
    assert Job.objects.filter(rerun_of=old).count() == 1


def test_beat_removes_the_logs_past_the_days_the_setting_keeps(old, recent, settings, time_machine):
    assert "jobs.tasks.prune_logs" in {e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()}
    time_machine.move_to(NOW, tick=False)
    settings.E31_LOG_KEEP_DAYS = 100
    tasks.prune_logs()
    assert LogChunk.objects.filter(job=old).exists()
    settings.E31_LOG_KEEP_DAYS = 90
    tasks.prune_logs()
    assert not LogChunk.objects.filter(job=old).exists() and LogChunk.objects.filter(job=recent).exists()


@pytest.mark.django_db(False)
@pytest.mark.parametrize("days", ["0", "-5"])
def test_a_log_keep_below_one_day_is_refused_at_start(days):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "e31web.settings", "E31_LOG_KEEP_DAYS": days}
    started = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert started.returncode != 0 and "ImproperlyConfigured: E31_LOG_KEEP_DAYS" in started.stderr


# --------------------------------------------------------------------------- the list of output files


def _sealed(job: Job, files: int, *, attempts: tuple[int, ...] = (1,)) -> None:
    """``files`` rows per attempt in the job's manifest, as sealing writes them, and the summary of the last."""
    OutputFile.objects.bulk_create(
        OutputFile(job=job, attempt=attempt, path=f"out/{n}.bin", bytes=10, sha256="a" * 64)
        for attempt in attempts
        for n in range(files)
    )
    Job.objects.filter(id=job.id).update(
        sealed_files=files, sealed_bytes=10 * files, delivered_at=job.state_changed_at,
        output_uri="file:///srv/outputs/demo/run-7",
    )  # fmt: skip


def test_the_list_of_an_old_jobs_output_files_goes_with_its_log(old, recent):
    """A 1,000-task array of 10,000 files each is ten million manifest rows: they were kept for ever. Once the
    job's log goes, its list goes too, every attempt's; the summary (files, bytes, where) stays a record."""
    _sealed(old, 3, attempts=(1, 2))
    _sealed(recent, 2)
    assert logs.prune_logs(now=NOW, keep_days=90) == 1
    assert not OutputFile.objects.filter(job=old).exists()
    assert OutputFile.objects.filter(job=recent).count() == 2
    assert Job.objects.values_list("sealed_files", "sealed_bytes").get(id=old.id) == (3, 30)


def test_the_lists_of_files_go_a_bounded_number_of_rows_at_a_time_whatever_attempt_wrote_them(
    team, member, monkeypatch
):
    """A batch was bounded by the current attempt's files, but every attempt's rows went in one transaction: jobs
    whose last attempt sealed nothing after earlier ones sealed thousands each (a preemption spends no attempt)
    were deleted in one go. Rows go PRUNE_FILES at a time, before the job is marked, so a pruner stopped between
    leaves the job due, never rows no pruner will find."""
    monkeypatch.setattr(logs, "PRUNE_FILES", 10)
    jobs = [_job_with_log(team, member, state="released", ended=NOW - timedelta(days=100 - n), text=b"x\n")
            for n in range(3)]  # fmt: skip
    for job in jobs:
        _sealed(job, 20)
        Job.objects.filter(id=job.id).update(sealed_files=0)  # its last attempt sealed nothing
    with CaptureQueriesContext(connection) as queries:
        assert logs.prune_logs(now=NOW, keep_days=90) == 3
    deletes = [q["sql"] for q in queries if q["sql"].startswith('DELETE FROM "jobs_outputfile"')]
    bounded = [sql for sql in deletes if "LIMIT 10" in sql]
    assert len(bounded) >= 6, (
        deletes
    )  # and under the batch's lock, one more that finds what a stopped pruner left
    assert not OutputFile.objects.exists()


def test_the_job_page_and_a_download_say_the_list_of_files_was_removed(member_client, member_token, old):
    _sealed(old, 2)
    logs.prune_logs(now=NOW, keep_days=90)
    page = member_client.get(reverse("jobs:detail", args=[old.id])).content.decode()
    said = "The list of these files was removed with the log on 2026-12-01; the files stay at"
    assert said in page and f"file:///srv/outputs/demo/run-7/{old.id}-1/" in page
    download = member_client.get(reverse("jobs:output", args=[old.id]), {"path": "out/1.bin"})
    assert download.status_code == 410 and "was removed" in download.content.decode()
    api = member_client.get(
        f"/api/v1/jobs/{old.id}/outputs/download",
        {"path": "out/1.bin"},
        HTTP_AUTHORIZATION=f"Bearer {member_token}",
    )
    assert api.status_code == 410 and "was removed" in api.json()["detail"]
    outputs = member_client.get(f"/api/v1/jobs/{old.id}", HTTP_AUTHORIZATION=f"Bearer {member_token}").json()
    assert outputs["outputs"]["files"] == 2 and outputs["outputs"]["files_listed"] is False
