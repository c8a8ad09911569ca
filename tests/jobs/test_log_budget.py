"""A team's logs held in the database have a budget (E31_TEAM_LOG_BYTES), so no team can fill the platform's database.

Found by trying it: every part of every attempt keeps up to E31_LOG_CAP_BYTES (10 MiB) for 90 days, and nothing
counted a team's whole: a 1,000-task array printing random bytes stored about 10.5 GB of rows, and more arrays
more, in the database every team and the scheduler share. Past the budget a part's log keeps what fitted and one
line saying why it stops; other teams' logs are untouched, and the budget comes back as retention removes the
team's old logs.
"""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse
from django.utils import timezone

from jobs import logs
from jobs.models import Allocation, Job, LogChunk, TeamLogBytes
from tests.factories import JobFactory, NodeFactory

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

    threads = [threading.Thread(target=append, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
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
    executor = MigrationExecutor(connection)
    executor.migrate([("jobs", "0033_node_host_id")])
    for owner, size in ((team, 700), (team, 300), (other_team, 50)):  # the job and chunk tables are unchanged
        job = JobFactory(team=owner, state="released", attempt=1)
        LogChunk.objects.create(job=job, attempt=1, rank=0, offset=0, data=b"l" * size)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert (_held(team), _held(other_team)) == (1000, 50)

    job = _running(team)
    logs.append_log(job_id=job.id, attempt=1, rank=0, offset=0, data=b"new\n")
    assert b"E31_TEAM_LOG_BYTES" in _log(job) and b"new" not in _log(job)
