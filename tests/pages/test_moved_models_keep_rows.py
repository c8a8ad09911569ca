"""The public pages' models moved from e31web to public without touching their tables.

A database filled under the old schema (e31web's migrations up to 0003) is migrated forward, and
every row is read back through the new app's models: same ids, same values, same links, and the
append-only triggers still hold.
"""

from datetime import UTC, date, datetime

import pytest
from django.db import connection, transaction
from django.db.utils import DatabaseError

from public.models import (
    Application,
    IntakeChange,
    Invitation,
    Measurement,
    Problem,
    ProblemRevision,
    WaitlistEntry,
)
from tests.schema_states import migrated_back

LAST_OLD = ("e31web", "0003_seed_problems")  # the last migration before the models moved
OLD_SCHEMA = [("public", None), LAST_OLD]  # unapplies the move on both sides
AT = datetime(2026, 11, 2, 9, 30, tzinfo=UTC)


def _fill_old_schema(apps) -> dict[str, int]:
    """Rows of every moved model, written through the historical e31web models."""
    team = apps.get_model("accounts", "Team").objects.create(name="optics", slug="optics")
    user = apps.get_model("auth", "User").objects.create(username="ines@optics.example")
    old = {name: apps.get_model("e31web", name) for name in (
        "Problem", "ProblemRevision", "Measurement", "IntakeChange", "WaitlistEntry", "Application", "Invitation",
    )}  # fmt: skip
    problem = old["Problem"].objects.create(
        slug="moved-problem", title="A problem written before the move", summary="s", why_hard="w",
        open_questions=["q?"], measurement_keys=["bench.x"], status="solved", solution="done",
        solved_on=date(2026, 11, 1), position=9, added_at=AT, reviewed_at=AT,
    )  # fmt: skip
    revision = old["ProblemRevision"].objects.create(
        problem=problem, kind="solved", at=AT, author="olga", title=problem.title, summary="s", why_hard="w",
        open_questions=["q?"], measurement_keys=["bench.x"], status="solved", solution="done",
        solved_on=date(2026, 11, 1),
    )  # fmt: skip
    measurement = old["Measurement"].objects.create(
        key="bench.x", title="X", figures={"ratio": 0.5}, command="python bench/x.py", measured_at=AT
    )
    intake = old["IntakeChange"].objects.create(is_open=True, at=AT, by="olga")
    waiting = old["WaitlistEntry"].objects.create(email="wait@optics.example", note="later", created_at=AT)
    application = old["Application"].objects.create(
        team_name="Optics", contact_name="Ines", email="ines@optics.example", work="train", data_bytes=10**12,
        data_location="s3://optics", compute_request="8 GPUs", output="weights", output_bytes=10**9,
        can_run_when="now", status="accepted", created_at=AT, decided_at=AT, decided_by="olga", team=team,
    )  # fmt: skip
    application.problems.add(problem)
    invitation = old["Invitation"].objects.create(
        application=application, team=team, email=application.email, digest="d" * 64, created_at=AT,
        expires_at=AT, used_at=AT, user=user,
    )  # fmt: skip
    return {
        "problem": problem.id, "revision": revision.id, "measurement": measurement.id, "intake": intake.id,
        "waiting": waiting.id, "application": application.id, "invitation": invitation.id, "team": team.id,
        "user": user.id,
    }  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_rows_written_under_the_old_schema_are_read_through_the_public_models():
    with migrated_back(OLD_SCHEMA, state_of=LAST_OLD) as old:
        ids = _fill_old_schema(old)

    problem = Problem.objects.get(id=ids["problem"])
    assert (problem.slug, problem.status, problem.solution) == ("moved-problem", "solved", "done")
    revision = ProblemRevision.objects.get(id=ids["revision"])
    assert (revision.problem_id, revision.author, revision.solved_on) == (
        problem.id,
        "olga",
        date(2026, 11, 1),
    )
    assert Measurement.objects.get(id=ids["measurement"]).figures == {"ratio": 0.5}
    assert IntakeChange.objects.get(id=ids["intake"]).is_open is True
    assert WaitlistEntry.objects.get(id=ids["waiting"]).email == "wait@optics.example"
    application = Application.objects.get(id=ids["application"])
    assert (application.team_id, list(application.problems.values_list("id", flat=True))) == (
        ids["team"],
        [problem.id],
    )
    invitation = Invitation.objects.select_related("application").get(id=ids["invitation"])
    assert (invitation.application.id, invitation.user_id) == (application.id, ids["user"])


@pytest.mark.django_db(transaction=True)
def test_the_moved_tables_keep_their_append_only_triggers():
    with migrated_back(OLD_SCHEMA, state_of=LAST_OLD):
        pass
    row = Measurement.objects.create(key="bench.y", title="Y", figures={"n": 1}, command="c", measured_at=AT)
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE e31web_measurement SET title = 'changed' WHERE id = %s", [row.id])
