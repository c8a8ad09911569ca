"""Operators add, reword, review and mark problems solved in the console, with a preview."""

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from public.models import Problem, ProblemRevision
from tests.pages.factories import ProblemFactory


def _problem_post(**overrides: str) -> dict[str, str]:
    data = {
        "title": "Keeping checkpoints small",
        "summary": "Checkpoints of wide jobs are large.",
        "why_hard": "Writing them takes time on the meter.",
        "open_questions": "How often?\n\nWhere to keep them?\n",
        "measurement_keys": "staging.throughput, scheduler.simulation",
        "note": "",
        "action": "save",
    }
    return {**data, **overrides}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "name, args",
    [
        ("problem-new", []),
        ("problem-edit", ["capacity"]),
        ("problem-solve", ["capacity"]),
    ],
)
def test_visitors_are_sent_to_sign_in_and_for_members_the_page_does_not_exist(
    client, member_client, name, args
):
    url = reverse(name, args=args)
    assert client.get(url).status_code == 302
    assert client.get(url)["Location"].startswith(reverse("accounts:login"))
    assert member_client.get(url).status_code == 404
    assert member_client.post(url, _problem_post()).status_code == 404
    assert member_client.post(reverse("problem-reviewed", args=["capacity"])).status_code == 404
    assert ProblemRevision.objects.count() == 4


@pytest.mark.django_db
def test_an_operator_adds_a_problem_and_it_is_published_with_an_added_revision(operator_client, client):
    response = operator_client.post(reverse("problem-new"), _problem_post())
    assert response.status_code == 302
    problem = Problem.objects.get(title="Keeping checkpoints small")
    assert response["Location"] == f"{reverse('unsolved')}#problem-{problem.slug}"
    assert problem.open_questions == ["How often?", "Where to keep them?"]
    assert problem.measurement_keys == ["staging.throughput", "scheduler.simulation"]
    assert list(problem.revisions.values_list("kind", "author")) == [("added", "olga")]
    assert "Keeping checkpoints small" in client.get(reverse("unsolved")).content.decode()


@pytest.mark.django_db
def test_an_operator_rewords_a_problem_and_the_old_wording_stays_in_its_history(operator_client):
    problem = Problem.objects.get(slug="capacity")
    old_summary = problem.summary
    post = _problem_post(title=problem.title, summary="Clearer words.", note="shorter", measurement_keys="")
    response = operator_client.post(reverse("problem-edit", args=[problem.slug]), post)
    assert response.status_code == 302
    problem.refresh_from_db()
    assert problem.summary == "Clearer words."
    assert problem.slug == "capacity"  # links to it keep working
    added, reworded = problem.revisions.all()
    assert (added.summary, reworded.summary) == (old_summary, "Clearer words.")
    assert (reworded.kind, reworded.note) == ("reworded", "shorter")


@pytest.mark.django_db
def test_the_edit_form_starts_from_the_current_wording(operator_client):
    html = operator_client.get(reverse("problem-edit", args=["fair-scheduling"])).content.decode()
    assert "Scheduling mixed job sizes fairly" in html
    assert "scheduler.simulation" in html


@pytest.mark.django_db
def test_an_operator_marks_a_problem_solved_and_it_moves_to_the_solved_section(operator_client, client):
    problem = Problem.objects.get(slug="job-declaration")
    today = timezone.now().date()
    post = {
        "solution": "Jobs declare elasticity.",
        "solved_on": today.isoformat(),
        "note": "",
        "action": "save",
    }
    response = operator_client.post(reverse("problem-solve", args=[problem.slug]), post)
    assert response.status_code == 302
    problem.refresh_from_db()
    assert (problem.status, problem.solved_on, problem.solution) == (
        "solved",
        today,
        "Jobs declare elasticity.",
    )
    assert problem.revisions.last().kind == "solved"
    page = client.get(reverse("unsolved"))
    assert problem in page.context["solved_problems"]
    assert operator_client.get(reverse("problem-solve", args=[problem.slug])).status_code == 302


@pytest.mark.django_db
def test_a_solved_date_in_the_future_is_refused_and_nothing_changes(operator_client):
    tomorrow = (timezone.now() + timedelta(days=2)).date().isoformat()
    post = {"solution": "Soon.", "solved_on": tomorrow, "action": "save"}
    response = operator_client.post(reverse("problem-solve", args=["capacity"]), post)
    assert response.status_code == 422
    assert "cannot be solved in the future" in response.content.decode()
    assert Problem.objects.get(slug="capacity").status == "open"


@pytest.mark.django_db
def test_the_preview_button_shows_the_new_wording_without_saving_it(operator_client):
    post = _problem_post(summary="A previewed summary.", action="preview")
    response = operator_client.post(reverse("problem-edit", args=["capacity"]), post)
    assert response.status_code == 200
    html = response.content.decode()
    assert "Preview" in html and "A previewed summary." in html
    assert "<html" in html  # the whole page: works without JavaScript
    assert Problem.objects.get(slug="capacity").summary != "A previewed summary."
    assert ProblemRevision.objects.count() == 4


@pytest.mark.django_db
def test_the_htmx_preview_returns_only_the_preview_fragment(operator_client):
    post = _problem_post(summary="Fragment summary.", action="preview")
    response = operator_client.post(reverse("problem-new"), post, HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<section id="problem-preview"')
    assert "Fragment summary." in html and "<html" not in html
    assert not Problem.objects.filter(title="Keeping checkpoints small").exists()


@pytest.mark.django_db
def test_a_preview_of_a_solution_shows_it_as_solved_without_saving(operator_client):
    post = {
        "solution": "A previewed solution.",
        "solved_on": timezone.now().date().isoformat(),
        "action": "preview",
    }
    response = operator_client.post(reverse("problem-solve", args=["capacity"]), post, HTTP_HX_REQUEST="true")
    assert "A previewed solution." in response.content.decode()
    assert Problem.objects.get(slug="capacity").status == "open"


@pytest.mark.django_db
def test_an_invalid_edit_is_refused_with_422_errors_beside_fields_and_nothing_changes(operator_client):
    post = _problem_post(title="", why_hard="x" * 4001, measurement_keys="Not A Key")
    response = operator_client.post(reverse("problem-edit", args=["capacity"]), post)
    assert response.status_code == 422
    html = response.content.decode()
    assert html.count('class="field-error"') == 3
    assert "not a measurement key: Not" in html
    assert ProblemRevision.objects.count() == 4


@pytest.mark.django_db
def test_an_htmx_preview_of_an_invalid_edit_lists_what_to_fix(operator_client):
    post = _problem_post(title="", action="preview")
    response = operator_client.post(reverse("problem-new"), post, HTTP_HX_REQUEST="true")
    assert response.status_code == 200  # htmx swaps only 2xx responses
    assert "Cannot preview yet" in response.content.decode()


@pytest.mark.django_db
def test_reviewed_with_no_change_moves_last_reviewed_and_adds_to_the_history(operator_client):
    problem = ProblemFactory(now=timezone.now() - timedelta(days=10))
    response = operator_client.post(reverse("problem-reviewed", args=[problem.slug]))
    assert response.status_code == 302
    problem.refresh_from_db()
    assert timezone.now() - problem.reviewed_at < timedelta(minutes=1)
    assert problem.revisions.last().kind == "reviewed"


@pytest.mark.django_db
def test_operator_forms_refuse_a_post_without_a_csrf_token(operator):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    assert client.post(reverse("problem-new"), _problem_post()).status_code == 403
    assert client.post(reverse("problem-reviewed", args=["capacity"])).status_code == 403
    assert ProblemRevision.objects.count() == 4


@pytest.mark.django_db
def test_operators_see_edit_actions_on_the_page_and_visitors_do_not(operator_client, client):
    edit = reverse("problem-edit", args=["capacity"])
    assert edit in operator_client.get(reverse("unsolved")).content.decode()
    assert edit not in client.get(reverse("unsolved")).content.decode()
