"""What the console measures about a problem, shown beside it from stored results."""

import re
from collections import Counter
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from django.urls import reverse
from django.utils import timezone

from common.append_only import AppendOnlyError
from public import services
from public.models import Measurement, Problem


def _card(html: str, slug: str) -> str:
    start = html.index(f'id="problem-{slug}"')
    return html[start : html.index("</article>", start)]


def _record(key: str = "scheduler.simulation", *, ago: timedelta = timedelta(0), **figures):
    return services.record_measurement(
        key=key,
        title="Scheduler simulation, 2,000 nodes",
        figures=figures or {"jobs": 100000, "p95 wait (s)": 412.5},
        command="python bench/simulate.py --nodes 2000",
        now=timezone.now() - ago,
    )


@pytest.mark.django_db
def test_the_latest_measurement_is_shown_beside_its_problem_with_the_command_that_made_it(client):
    _record(ago=timedelta(days=2), utilisation=0.5)
    _record(utilisation=0.912345678)
    card = _card(client.get(reverse("unsolved")).content.decode(), "fair-scheduling")
    assert "Scheduler simulation, 2,000 nodes" in card
    assert "0.912346" in card  # the newest, not the older 0.5
    assert "<dd>0.5</dd>" not in card
    assert "python bench/simulate.py --nodes 2000" in card
    assert Measurement.objects.filter(key="scheduler.simulation").count() == 2  # appended, not replaced


@pytest.mark.django_db
def test_measurements_are_labelled_as_this_consoles_and_not_as_a_solution(client):
    _record()
    card = _card(client.get(reverse("unsolved")).content.decode(), "fair-scheduling")
    assert "What this console measures" in card
    assert "not a claim that the problem is solved" in card


@pytest.mark.django_db
def test_a_problem_whose_measurements_are_missing_says_none_recorded_yet(client):
    _record("staging.throughput", bytes_per_s=2.1e9)
    card = _card(client.get(reverse("unsolved")).content.decode(), "large-datasets")
    assert "2.1e+09" in card
    assert "staging.cache</code>: no measurement recorded yet" in card


@pytest.mark.django_db
def test_a_problem_without_measurement_keys_shows_no_measurement_box(client):
    _record()
    card = _card(client.get(reverse("unsolved")).content.decode(), "capacity")
    assert "What this console measures" not in card


@pytest.mark.django_db
def test_a_measurement_is_never_updated_or_deleted():
    row = _record()
    row.title = "nicer numbers"
    with pytest.raises(AppendOnlyError):
        row.save()
    with pytest.raises(AppendOnlyError):
        row.delete()
    with pytest.raises(AppendOnlyError):
        Measurement.objects.filter(id=row.id).update(figures={"jobs": 1})
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE e31web_measurement SET title = 'x' WHERE id = %s", [row.id])


@pytest.mark.django_db
@pytest.mark.parametrize(
    "key, figures",
    [("Bad Key", {"a": 1}), ("", {"a": 1}), ("staging.throughput", {}), ("staging.throughput", [1, 2])],
)
def test_record_measurement_refuses_a_malformed_key_or_figures(key, figures):
    with pytest.raises(ValueError):
        services.record_measurement(key=key, title="t", figures=figures, command="c", now=timezone.now())
    assert not Measurement.objects.exists()


@pytest.mark.django_db
def test_html_in_a_measurement_is_shown_as_text(client):
    _record(**{"<i>label</i>": "<script>x()</script>"})
    html = client.get(reverse("unsolved")).content.decode()
    assert "<script>x()</script>" not in html and "&lt;script&gt;x()&lt;/script&gt;" in html


@pytest.mark.django_db
def test_a_measurement_shown_beside_two_problems_does_not_repeat_an_element_id(client, operator):
    """The editor allows any key on any problem: "scheduler.simulation" beside a second one too."""
    _record()
    problem = Problem.objects.get(slug="job-declaration")
    services.reword_problem(
        problem_id=problem.id, title=problem.title, summary=problem.summary, why_hard=problem.why_hard,
        open_questions=problem.open_questions, measurement_keys=[*problem.measurement_keys, "scheduler.simulation"],
        note="also relevant", author=operator.username, now=timezone.now(),
    )  # fmt: skip
    html = client.get(reverse("unsolved")).content.decode()
    assert html.count("Scheduler simulation, 2,000 nodes") == 2
    ids = Counter(re.findall(r'\sid="([^"]+)"', html))
    assert [i for i, n in ids.items() if n > 1] == []


@pytest.mark.django_db
def test_the_public_page_names_a_replayed_trace_by_its_file_name_and_the_row_keeps_the_path(client):
    """``record_simulation --trace`` is given a path on the operator's machine; readers see only its name."""
    command = (
        "python manage.py record_simulation --trace '/home/olga/private traces/cluster04.csv' --load 0.9"
    )
    services.record_measurement(
        key="scheduler.simulation",
        title="Trace replay",
        figures={"jobs": 10},
        command=command,
        now=timezone.now(),
    )
    html = client.get(reverse("unsolved")).content.decode()
    assert (
        "Produced by <code>python manage.py record_simulation --trace cluster04.csv --load 0.9</code>" in html
    )
    assert "/home/olga" not in html
    assert Measurement.objects.get().command == command
