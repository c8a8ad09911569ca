"""A <details> the reader opened inside a polled fragment stays open across the poll's swap, on every
page that polls (not only the job page): the jobs list's array expander and the utilisation table."""

from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import expect

from jobs.models import Job
from tests.browser.conftest import queued_array
from tests.browser.test_journeys import sign_in
from tests.browser.test_live_focus import wait_for_next, watch_swaps
from tests.operations.conftest import store_samples

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]


def test_the_array_expander_of_the_jobs_list_stays_open_with_its_tasks_while_the_list_polls(
    team, open_page, audit
):
    array = queued_array(team)  # queued: the list polls every 3 s
    page = open_page()
    sign_in(page, "mia")
    page.goto("/jobs/")
    watch_swaps(page)
    expander = page.locator(f"#array-{array.id}-tasks")
    expander.locator("summary").click()
    expect(expander.locator(".array-tasks table")).to_contain_text("task 2")  # its tasks, loaded when opened
    for _ in range(2):
        wait_for_next(page, "job-list-rows")
        assert page.evaluate(f"document.getElementById('array-{array.id}-tasks').open"), "a poll folded it"
        # Its tasks stay shown through the swap (no flash of the "Show its tasks" link) while they reload.
        assert "task 2" in expander.locator(".array-tasks").inner_text(), "the swap dropped the tasks shown"
    Job.objects.filter(array=array, array_index=0).update(state="ended", end_reason="cancelled")
    # ...and they are read afresh at each poll, as the summary is.
    expect(expander.locator(".array-tasks table tr", has_text="task 0")).to_contain_text(
        "cancelled", timeout=10_000
    )
    audit.check(page, "jobs-array-open")
    audit.assert_clean()


def test_the_utilisation_table_an_operator_opened_stays_open_at_the_refresh(team, open_page, audit):
    store_samples(
        start=datetime.now(UTC) - timedelta(hours=2), minutes=90, total=8, busy=6, team_busy={team.id: 4}
    )
    page = open_page()
    sign_in(page, "olga")
    page.goto("/operator/utilisation/")
    watch_swaps(page)
    charts = page.locator("section[id^='utilisation-']")
    charts_id = charts.get_attribute("id")
    table = charts.locator("details", has_text="The same figures as a table")
    table.locator("summary").click()
    expect(table).to_have_attribute("open", "")
    # The fragment refreshes every 60 s: the test makes this copy poll every second, the same swap sooner.
    charts.evaluate("(section) => { section.setAttribute('hx-trigger', 'every 1s'); htmx.process(section); }")
    wait_for_next(page, charts_id)
    assert page.evaluate(f"document.getElementById('{charts_id}').querySelector('details').open"), (
        "the refresh folded the table shut"
    )
    audit.assert_clean()
