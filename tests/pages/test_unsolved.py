"""The public unsolved-problems page, its publishing rule and its Atom feed."""

import xml.etree.ElementTree as ET
from datetime import date, timedelta

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.urls import reverse
from django.utils import timezone

from common.append_only import AppendOnlyError
from public import services
from public.models import Problem, ProblemRevision
from tests.pages.factories import ProblemFactory

ATOM = "{http://www.w3.org/2005/Atom}"
SEEDED = [
    "Getting large datasets to the compute",
    "Scheduling mixed job sizes fairly",
    "Where the capacity comes from",
    "What a job must declare to be scheduled well",
]


def _solve(problem: Problem, *, solution: str = "We built a staging cache.", on: date | None = None):
    return services.mark_problem_solved(
        problem_id=problem.id,
        solution=solution,
        solved_on=on or date.today(),
        author="olga",
        now=timezone.now(),
    )


@pytest.mark.django_db
def test_the_four_seeded_problems_are_on_the_public_page_with_all_their_parts(client):
    response = client.get(reverse("unsolved"))
    assert response.status_code == 200
    html = response.content.decode()
    for title in SEEDED:
        assert title in html
    for part in ("Why it is hard", "Open questions", "Added ", "last reviewed", "History"):
        assert part in html
    assert Problem.objects.open().count() == 4
    assert all(p.revisions.filter(kind="added").count() == 1 for p in Problem.objects.all())


@pytest.mark.django_db
def test_a_problem_is_never_deleted_by_the_model_the_queryset_or_sql():
    problem = Problem.objects.get(slug="capacity")
    with pytest.raises(AppendOnlyError):
        problem.delete()
    with pytest.raises(AppendOnlyError):
        Problem.objects.filter(id=problem.id).delete()
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM e31web_problem WHERE id = %s", [problem.id])
    assert Problem.objects.filter(id=problem.id).exists()


@pytest.mark.django_db
def test_a_problem_is_not_edited_by_save_so_no_edit_escapes_the_history():
    problem = Problem.objects.get(slug="capacity")
    problem.title = "Quietly changed"
    with pytest.raises(AppendOnlyError):
        problem.save()


@pytest.mark.django_db
def test_a_revision_is_never_updated_or_deleted_by_the_model_the_queryset_or_sql():
    revision = ProblemRevision.objects.first()
    revision.note = "rewritten history"
    with pytest.raises(AppendOnlyError):
        revision.save()
    with pytest.raises(AppendOnlyError):
        revision.delete()
    with pytest.raises(AppendOnlyError):
        ProblemRevision.objects.update(note="x")
    with pytest.raises(AppendOnlyError):
        ProblemRevision.objects.all().delete()
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE e31web_problemrevision SET note = 'x' WHERE id = %s", [revision.id])
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM e31web_problemrevision WHERE id = %s", [revision.id])


@pytest.mark.django_db
def test_the_database_refuses_a_solved_problem_without_a_solution_and_date():
    problem = ProblemFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        Problem.objects.filter(id=problem.id).update(status="solved")
    with pytest.raises(ValueError):
        _solve(problem, solution="   ")
    assert Problem.objects.get(id=problem.id).status == "open"


@pytest.mark.django_db
def test_a_solved_problem_leaves_the_open_list_and_stays_on_the_page_under_solved(client):
    problem = ProblemFactory(title="Moving petabytes")
    _solve(problem, solution="A cache near the pool.", on=date(2026, 11, 2))
    response = client.get(reverse("unsolved"))
    assert problem not in response.context["open_problems"]
    assert [p.id for p in response.context["solved_problems"]] == [problem.id]
    html = response.content.decode()
    solved_section = html[html.index('id="solved-heading"') :]
    assert "Moving petabytes" in solved_section
    assert "A cache near the pool." in solved_section
    assert "solved 2 Nov 2026" in solved_section


@pytest.mark.django_db
def test_marking_a_problem_solved_twice_records_one_revision():
    problem = ProblemFactory()
    assert _solve(problem) is not None
    assert _solve(problem, solution="something else") is None
    assert problem.revisions.filter(kind="solved").count() == 1
    assert Problem.objects.get(id=problem.id).solution == "We built a staging cache."


@pytest.mark.django_db
def test_every_edit_is_kept_and_the_page_shows_the_history(client):
    problem = ProblemFactory(title="Old title")
    services.reword_problem(
        problem_id=problem.id,
        title="New title",
        summary=problem.summary,
        why_hard=problem.why_hard,
        open_questions=problem.open_questions,
        measurement_keys=[],
        note="clearer name",
        author="olga",
        now=timezone.now(),
    )
    services.mark_problem_reviewed(problem_id=problem.id, author="olga", now=timezone.now())
    _solve(problem)
    kinds = list(problem.revisions.values_list("kind", "title"))
    assert kinds == [
        ("added", "Old title"),
        ("reworded", "New title"),
        ("reviewed", "New title"),
        ("solved", "New title"),
    ]
    html = client.get(reverse("unsolved")).content.decode()
    today = timezone.now().strftime("%-d %b %Y")
    for line in (
        f"added on {today}",
        f"reworded on {today}",
        f"reviewed on {today}, no change",
        f"marked solved on {today}",
    ):
        assert line in html
    assert "clearer name" in html
    assert "olga" not in html  # operators' user names stay off the public page


@pytest.mark.django_db
def test_rewording_with_nothing_changed_records_no_revision():
    problem = ProblemFactory()
    revision = services.reword_problem(
        problem_id=problem.id,
        title=problem.title,
        summary=problem.summary,
        why_hard=problem.why_hard,
        open_questions=problem.open_questions,
        measurement_keys=problem.measurement_keys,
        note="",
        author="olga",
        now=timezone.now(),
    )
    assert revision is None
    assert problem.revisions.count() == 1


@pytest.mark.django_db
def test_the_feed_is_atom_with_an_entry_for_every_change(client):
    problem = ProblemFactory(title="Feed me")
    _solve(problem, solution="Done properly.")
    response = client.get(reverse("unsolved-feed"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/atom+xml")
    root = ET.fromstring(response.content)
    entries = root.findall(f"{ATOM}entry")
    assert len(entries) == ProblemRevision.objects.count() == 6
    titles = [e.findtext(f"{ATOM}title") for e in entries]
    assert titles[:2] == ["Feed me: marked solved", "Feed me: added"]
    ids = [e.findtext(f"{ATOM}id") for e in entries]
    assert len(set(ids)) == len(ids)
    assert "Done properly." in entries[0].findtext(f"{ATOM}summary")


@pytest.mark.django_db
def test_html_in_a_problem_is_shown_as_text_on_the_page_and_in_the_feed(client):
    ProblemFactory(title="<b>bold</b>", summary="<script>alert(1)</script>", open_questions=["<img src=x>"])
    html = client.get(reverse("unsolved")).content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<img src=x>" not in html and "<b>bold</b>" not in html
    root = ET.fromstring(client.get(reverse("unsolved-feed")).content)
    summary = root.find(f"{ATOM}entry").findtext(f"{ATOM}summary")
    # The summary is HTML to a feed reader: the script must arrive as escaped text inside it.
    assert "<script>" not in summary and "&lt;script&gt;" in summary


@pytest.mark.django_db
def test_the_page_needs_a_bounded_number_of_queries(client, django_assert_max_num_queries):
    for _ in range(5):
        ProblemFactory(measurement_keys=["scheduler.simulation"])
    with django_assert_max_num_queries(12):
        client.get(reverse("unsolved"))


@pytest.mark.django_db
def test_the_page_shows_when_a_problem_was_added_and_last_reviewed(client):
    added = timezone.now() - timedelta(days=30)
    problem = ProblemFactory(now=added)
    services.mark_problem_reviewed(problem_id=problem.id, author="olga", now=timezone.now())
    html = client.get(reverse("unsolved")).content.decode()
    card = html[html.index(f'id="problem-{problem.slug}"') :]
    assert f"Added {added:%-d %b %Y} · last reviewed {timezone.now():%-d %b %Y}" in card
