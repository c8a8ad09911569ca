"""The simulator's figures reach the console from a run, never typed in by hand."""

from io import StringIO

import pytest
from django.core.management import call_command

from public.models import Measurement

pytestmark = pytest.mark.django_db

TINY_ITP = "job_id,submission_time,duration,num_gpu\n" + "\n".join(
    f"j{i},{i * 60},{600 + 60 * (i % 5)},{1 + (i % 4) * 2}" for i in range(40)
)


def test_a_replay_is_recorded_as_the_scheduler_measurement(tmp_path):
    trace = tmp_path / "tiny.csv"
    trace.write_text(TINY_ITP + "\n")
    call_command("record_simulation", "--trace", str(trace), "--load", "0.9", stdout=StringIO())
    measurement = Measurement.objects.filter(key="scheduler.simulation").latest("measured_at")
    assert measurement.figures["jobs"] == 40
    assert set(measurement.figures["policies"]) == {"default", "easy-nodes", "easy", "sjf-easy", "fcfs"}
    assert measurement.command.startswith("python manage.py record_simulation --trace")


def test_the_operator_queue_page_shows_the_latest_replay(tmp_path, operator_client):
    trace = tmp_path / "tiny.csv"
    trace.write_text(TINY_ITP + "\n")
    call_command("record_simulation", "--trace", str(trace), "--policies", "default,easy", stdout=StringIO())
    html = operator_client.get("/operator/queue/").content.decode()
    assert (
        "Latest trace replay" in html
        and "tiny.csv" in html
        and "<td>textbook EASY-FCFS (flat pool)</td>" in html
    )
    assert "against textbook EASY-FCFS" in html


def _card(html: str, slug: str) -> str:
    start = html.index(f'id="problem-{slug}"')
    return html[start : html.index("</article>", start)]


def test_what_each_declaration_buys_is_recorded_and_shown_beside_what_a_job_must_declare(tmp_path, client):
    trace = tmp_path / "tiny.csv"
    trace.write_text(TINY_ITP + "\n")
    call_command(
        "record_simulation", "--declarations", "--trace", str(trace), "--load", "0.9", stdout=StringIO()
    )
    measurement = Measurement.objects.filter(key="scheduler.declarations").latest("measured_at")
    (replayed,) = measurement.figures["traces"]
    assert replayed["trace"] == "tiny.csv" and replayed["rows"][0]["scenario"] == "today's declarations"
    assert measurement.command.startswith("python manage.py record_simulation --declarations --trace")
    card = _card(client.get("/unsolved/").content.decode(), "job-declaration")
    assert "Measured on tiny.csv (40 jobs" in card
    assert "<td>learned run times</td>" in card and "<td>half the jobs checkpoint</td>" in card
    assert "What a checkpoint costs: a checkpoint every 30 minutes" in card
    assert "GPU-hours lost to preemption" in card
