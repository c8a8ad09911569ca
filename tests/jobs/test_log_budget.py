"""A team's logs held in the database have a budget (E31_TEAM_LOG_BYTES), so no team can fill the platform's database.

Found by trying it: every part of every attempt keeps up to E31_LOG_CAP_BYTES (10 MiB) for 90 days, and nothing
counted a team's whole: a 1,000-task array printing random bytes stored about 10.5 GB of rows, and more arrays
more, in the database every team and the scheduler share. Past the budget a part's log keeps what fitted and one
line saying why it stops; other teams' logs are untouched, and the budget comes back as retention removes the
team's old logs.
"""

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.urls import reverse
from django.utils import timezone

from jobs import logs
from jobs.models import Allocation, Job, LogChunk, TeamLogBytes
from tests.factories import JobFactory, NodeFactory
from tests.schema_states import migrated_back

pytestmark = pytest.mark.django_db

BUDGET = 1000


@pytest.fixture(autouse=True)
def budget(settings):
    settings.E31_TEAM_LOG_BYTES = BUDGET


def _running(team, *, ranks: int = 1) -> Job:
    job = JobFactory(team=team, state="running", attempt=1)
    for rank in range(ranks):
        Allocation.objects.create(
            job=job, attempt=1, rank=rank, node=NodeFactory(), gpu_indices=[0], rented_at=timezone.now()
        )
    return job


def _log(job: Job, rank: int = 0) -> bytes:
    return b"".join(logs.log_bytes(job, attempt=1, rank=rank))


def _together(*targets) -> None:
    threads = [threading.Thread(target=target) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _held(team) -> int:
    return TeamLogBytes.objects.get(team=team).bytes


def test_past_the_budget_a_log_keeps_what_fitted_and_says_why_it_stops(team):
    job = _running(team)
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=b"a" * 600)
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=600, data=b"b" * 600)
    kept = _log(job)
    assert kept.startswith(b"a" * 600 + b"b" * 400)
    note = kept[1000:].decode()
    assert "team's logs" in note and "1,000 bytes" in note and "E31_TEAM_LOG_BYTES" in note
    assert _held(team) == len(
        kept
    )  # the note counts too: one a part, it passes the budget by its length only

    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=1200, data=b"c" * 10)
    assert _log(job) == kept  # nothing past the note, so a reader's offsets stay the log's own
    text = logs.read_log(job, attempt=1, rank=0, offset=0).text
    assert text.endswith(note)


def test_another_teams_logs_are_untouched_by_a_spent_budget(team, other_team):
    spender, neighbour = _running(team), _running(other_team)
    logs.append_log(job_id=spender.id, attempt=1, rank=0, offset=0, data=b"x" * 5000)
    logs.append_log(job_id=neighbour.id, attempt=1, rank=0, offset=0, data=b"epoch 1\n")
    assert _log(neighbour) == b"epoch 1\n"
    assert _held(other_team) == 8


def test_every_part_of_a_spent_team_gets_the_note_once(team):
    job = _running(team, ranks=2)
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=b"r0" * 500)
    logs.append_log(job_id=job.id, attempt=1, rank=1, offset=0, data=b"r1\n")
    logs.append_log(job_id=job.id, attempt=1, rank=1, offset=3, data=b"r1\n")
    assert b"E31_TEAM_LOG_BYTES" in _log(job, rank=1)
    assert _log(job, rank=1).count(b"E31_TEAM_LOG_BYTES") == 1


def test_a_resent_piece_is_counted_once(team):
    job = _running(team)
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=b"epoch 1\n")
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=b"epoch 1\nepoch 2\n")
    assert _held(team) == 16 and _log(job) == b"epoch 1\nepoch 2\n"


def test_removing_a_teams_old_logs_gives_its_budget_back(team):
    old = _running(team)
    logs.append_log(job_id=old.id, attempt=1, rank=0, offset=0, data=b"o" * 900)
    ended = datetime(2026, 1, 1, tzinfo=UTC)
    Job.objects.filter(id=old.id).update(state="released", state_changed_at=ended)
    assert logs.prune_logs(now=ended + timedelta(days=91), keep_days=90) == 1
    assert _held(team) == 0

    new = _running(team)
    logs.append_log(job_id=new.id, attempt=1, rank=0, offset=0, data=b"n" * 900)
    assert _log(new) == b"n" * 900


@pytest.mark.django_db(transaction=True)
def test_parts_appending_at_once_never_hold_more_than_the_budget_together(team):
    jobs = [_running(team) for _ in range(6)]
    start = threading.Barrier(len(jobs))

    def append(job: Job) -> None:
        try:
            start.wait()
            for i in range(10):
                logs.append_log(job_id=job.id, attempt=1, rank=0, offset=i * 50, data=b"~" * 50)
        finally:
            connections.close_all()

    _together(*(lambda job=job: append(job) for job in jobs))
    kept = [_log(job) for job in jobs]
    assert sum(log.count(b"~") for log in kept) == BUDGET  # 3,000 bytes offered
    assert sum(b"E31_TEAM_LOG_BYTES" in log for log in kept) >= 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT SUM(LENGTH(data)) FROM jobs_logchunk")
        assert cursor.fetchone()[0] == sum(map(len, kept)) == _held(team)


def test_the_operators_team_page_shows_the_logs_the_team_holds_against_its_budget(
    team, operator_client, settings
):
    settings.E31_TEAM_LOG_BYTES = 2 * 1024**3
    job = _running(team)
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=b"x" * 3 * 1024**2)
    page = operator_client.get(reverse("operations:team", args=[team.slug])).content.decode()
    assert "Logs held" in page and "3.1 MB of 2.1 GB" in page and "E31_TEAM_LOG_BYTES" in page


@pytest.mark.django_db(transaction=True)
def test_the_budget_starts_from_the_logs_already_held_when_it_is_deployed(team, other_team):
    sizes = [(team, 700), (team, 300), (other_team, 50)]
    jobs = [
        JobFactory(team=owner, state="released", attempt=1) for owner, _ in sizes
    ]  # its table has changed since
    with migrated_back([("jobs", "0033_node_host_id")]):
        for job, (_, size) in zip(jobs, sizes, strict=True):  # the chunk table has not
            LogChunk.objects.create(job=job, attempt=1, rank=0, offset=0, data=b"l" * size)
    assert (_held(team), _held(other_team)) == (1000, 50)

    job = _running(team)
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=b"new\n")
    assert b"E31_TEAM_LOG_BYTES" in _log(job) and b"new" not in _log(job)


def test_bytes_the_count_never_saw_do_not_stop_retention_for_any_team(team, other_team):
    """Found in review: the pruner's subtraction went below nothing (a CHECK violation) for a team whose count had
    missed a chunk (an older agent writing while the change was deployed), and every hourly run failed on the
    same batch, other teams' old logs with it."""
    ended = datetime(2026, 1, 1, tzinfo=UTC)
    a, b = _running(team), _running(other_team)
    logs.append_log(job_id=a.id, attempt=1, rank=0, offset=0, data=b"a" * 100)
    logs.append_log(job_id=b.id, attempt=1, rank=0, offset=0, data=b"b" * 100)
    LogChunk.objects.create(job=a, attempt=1, rank=0, offset=100, data=b"x" * 50)  # never counted
    Job.objects.filter(id__in=[a.id, b.id]).update(state="released", state_changed_at=ended)
    assert logs.prune_logs(now=ended + timedelta(days=91), keep_days=90) == 2
    assert not LogChunk.objects.exists() and (_held(team), _held(other_team)) == (0, 0)


def test_a_cut_log_is_complete_at_once_so_a_follower_stops(team):
    job = _running(team)
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=b"y" * 2000)
    assert logs.read_log(job, attempt=1, rank=0, offset=0).complete


@pytest.mark.django_db(transaction=True)
def test_a_cut_never_deadlocks_with_a_release_of_the_same_job(team, monkeypatch):
    """Found in review: the cut marked the allocation, then stored its chunks (which takes the job's row), the
    reverse of the lifecycle's order (the job's row, then its allocations): a release at that moment deadlocked."""
    job = _running(team)
    TeamLogBytes.objects.create(team=team, bytes=BUDGET)  # spent: the next piece is cut
    storing, job_locked, errors = threading.Event(), threading.Event(), []
    store = logs._store

    def slow_store(*args, **kwargs):
        storing.set()
        job_locked.wait(5)
        return store(*args, **kwargs)

    monkeypatch.setattr(logs, "_store", slow_store)

    def append() -> None:
        try:
            logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=b"late")
        except OperationalError as exc:
            errors.append(("append", str(exc)))
        finally:
            connections.close_all()

    def release() -> None:  # as rental.release_job takes them: the job's row, then its allocations
        try:
            storing.wait(5)
            with transaction.atomic():
                Job.objects.select_for_update().get(id=job.id)
                job_locked.set()
                Allocation.objects.filter(job_id=job.id).update(released_at=timezone.now())
        except OperationalError as exc:
            errors.append(("release", str(exc)))
        finally:
            connections.close_all()

    _together(append, release)
    assert errors == [] and b"E31_TEAM_LOG_BYTES" in _log(job)


@pytest.mark.django_db(transaction=True)
def test_a_part_storing_a_piece_holds_back_no_other_part_of_its_team(team, settings, monkeypatch):
    """Found in review: the team's row was locked for the whole of each store, so a team's parts shipped one at a
    time (about 10 ms a 256 KiB piece, 32 parts waiting up to 0.9 s). Stored first, counted after, they go side
    by side."""
    settings.E31_TEAM_LOG_BYTES = 10**9
    slow, quick = _running(team), _running(team)
    TeamLogBytes.objects.create(team=team, bytes=0)
    storing, done = threading.Event(), threading.Event()
    store = logs._store

    def stalled_store(job_id, *args, **kwargs):
        if job_id == slow.id:
            storing.set()
            done.wait(5)
        return store(job_id, *args, **kwargs)

    monkeypatch.setattr(logs, "_store", stalled_store)

    def append_slow() -> None:
        try:
            logs.append_log(job_id=slow.id, attempt=1, rank=0, offset=0, data=b"slow\n")
        finally:
            connections.close_all()

    thread = threading.Thread(target=append_slow)
    thread.start()
    assert storing.wait(5)
    began = time.monotonic()
    logs.append_log(job_id=quick.id, attempt=1, rank=0, offset=0, data=b"quick\n")
    waited = time.monotonic() - began
    done.set()
    thread.join()
    assert waited < 1.0 and _log(quick) == b"quick\n" and _log(slow) == b"slow\n" and _held(team) == 11
