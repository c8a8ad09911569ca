"""The schema gate: this code and the database's applied migrations agree, or a one-line reason says which
side is behind and what to do."""

import pytest
from django.db import OperationalError, connection
from django.db.migrations.executor import MigrationExecutor

from common import schema
from tests.common.schema_rows import code_newer, database_newer

CODE = schema.Code(
    apps=frozenset({"jobs", "auth"}),
    known=frozenset({("jobs", "0001_a"), ("jobs", "0002_b"), ("jobs", "0003_c"), ("jobs", "0001_squashed_0002"),
                     ("auth", "0001_initial")}),
    needed={("jobs", "0001_squashed_0002"): frozenset({("jobs", "0001_a"), ("jobs", "0002_b")}),
            ("jobs", "0003_c"): frozenset(), ("auth", "0001_initial"): frozenset()},
    version="0123456789ab",
)  # fmt: skip
ALL = frozenset({("jobs", "0001_a"), ("jobs", "0002_b"), ("jobs", "0003_c"), ("auth", "0001_initial")})


def test_code_and_database_agree_when_every_needed_migration_is_applied_and_none_is_unknown():
    assert schema.disagreement(CODE, ALL) == ""
    assert schema.disagreement(CODE, ALL | {("jobs", "0001_squashed_0002")}) == ""


def test_a_database_with_a_migration_the_code_does_not_know_is_newer_than_the_code():
    reason = schema.disagreement(CODE, ALL | {("jobs", "0004_d")})
    assert reason == (
        "the database has migrations this code does not know: jobs.0004_d; upgrade this machine's checkout"
    )


def test_a_database_lacking_a_migration_of_the_code_is_older_than_the_code():
    reason = schema.disagreement(CODE, ALL - {("jobs", "0003_c")})
    assert (
        reason
        == "this code has migrations the database lacks: jobs.0003_c; run `python manage.py migrate` first"
    )


def test_a_squash_is_applied_once_all_it_replaces_are_and_not_before():
    assert "jobs.0001_squashed_0002" in schema.disagreement(CODE, ALL - {("jobs", "0002_b")})


def test_rows_of_an_app_the_code_no_longer_has_do_not_count():
    assert schema.disagreement(CODE, ALL | {("gone", "0001_initial")}) == ""


def test_a_reason_names_three_migrations_and_counts_the_rest():
    reason = schema.disagreement(CODE, ALL | {("jobs", f"000{n}_x") for n in range(4, 9)})
    assert "jobs.0004_x, jobs.0005_x, jobs.0006_x and 2 more;" in reason
    assert "\n" not in reason


def test_the_version_names_the_latest_migration_of_each_app_whatever_their_order():
    one = schema.version_of([("jobs", "0032_x"), ("auth", "0012_y")])
    assert one == schema.version_of([("auth", "0012_y"), ("jobs", "0032_x")])
    assert one != schema.version_of([("jobs", "0033_z"), ("auth", "0012_y")])
    assert len(one) == 12 and int(one, 16) >= 0


def test_the_code_is_read_from_its_migration_files():
    code = schema.code()
    assert {"jobs", "auth", "common"} <= code.apps
    assert ("jobs", "0001_initial") in code.known and ("jobs", "0001_initial") in code.needed
    assert code.version == schema.code().version


@pytest.mark.django_db
def test_the_migrated_test_database_agrees_with_this_code():
    assert schema.check(connection) == ""


@pytest.mark.django_db
def test_a_migration_applied_by_newer_code_is_found():
    with database_newer() as future:
        reason = schema.check(connection)
    assert (
        reason
        == f"the database has migrations this code does not know: {future}; upgrade this machine's checkout"
    )
    assert schema.check(connection) == ""  # put back


@pytest.mark.django_db
def test_a_migration_not_yet_applied_is_found_as_django_plans_it():
    with code_newer() as latest:
        reason = schema.check(connection)
        executor = MigrationExecutor(connection)
        planned = [
            f"{m.app_label}.{m.name}" for m, _ in executor.migration_plan(executor.loader.graph.leaf_nodes())
        ]
    assert planned == [latest]
    assert (
        reason
        == f"this code has migrations the database lacks: {latest}; run `python manage.py migrate` first"
    )
    assert schema.check(connection) == ""


@pytest.mark.django_db
def test_the_look_at_the_database_is_one_query(django_assert_num_queries):
    with django_assert_num_queries(1):
        assert ("jobs", "0001_initial") in schema.applied(connection)


def test_a_process_starting_before_its_database_waits_for_it_a_while(monkeypatch):
    """After a reboot gunicorn or a worker may start before PostgreSQL takes connections: the check waits for it
    (``DATABASE_WAIT_S``) instead of exiting on the first refused connection with a traceback."""
    answers = [OperationalError("connection refused"), OperationalError("connection refused"), ""]

    def check(connection):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(schema, "check", check)
    monkeypatch.setattr(schema, "DATABASE_RETRY_S", 0.01)
    schema.refuse_to_start("web", connection=None)
    assert answers == []


def test_a_database_that_never_answers_stops_the_start_with_one_line(monkeypatch):
    def check(connection):
        raise OperationalError('connection to server at "127.0.0.1", port 5432 failed: Connection refused')

    monkeypatch.setattr(schema, "check", check)
    monkeypatch.setattr(schema, "DATABASE_RETRY_S", 0.01)
    monkeypatch.setattr(schema, "DATABASE_WAIT_S", 0.05)
    with pytest.raises(SystemExit) as stopped:
        schema.refuse_to_start("web", connection=None)
    assert str(stopped.value) == (
        'web not started: the database does not answer: connection to server at "127.0.0.1", port 5432 failed: '
        "Connection refused"
    )
