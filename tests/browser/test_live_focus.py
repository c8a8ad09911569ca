"""Live fragments are swapped whole at each poll (hx-swap="outerHTML"): what the reader holds in one
survives the swap. Keyboard focus on a button or a link comes back to the same control in the new copy,
and a text selection in a polled fragment holds the poll's swap off until the reader lets go of it.
No pool runs: a queued job keeps every page polling."""

import json

import pytest
from playwright.sync_api import expect

from tests.browser.test_journeys import sign_in
from tests.factories import JobFactory

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

# Counts, per swap target's id, the requests answered (a swap done or skipped) and the swaps settled.
# Installed after console.js, so its own listeners have run when a count moves.
WATCH = """() => {
  window.__answered = {}; window.__settled = {};
  const bump = (counts, id) => { if (id) counts[id] = (counts[id] || 0) + 1; };
  document.addEventListener("htmx:afterRequest", (e) => bump(window.__answered, e.detail.target?.id));
  document.addEventListener("htmx:afterSettle", (e) => bump(window.__settled, e.target.id));
}"""


def watch_swaps(page) -> None:
    page.evaluate(WATCH)


def wait_for_next(page, target_id: str, *, settled: bool = True) -> None:
    """Waits for the next poll of ``target_id``: its swap settled, or (``settled=False``) its answer handled."""
    count = f"(window.{'__settled' if settled else '__answered'}[{json.dumps(target_id)}] || 0)"
    seen = page.evaluate(count)
    # A function, not an expression: Playwright evaluates a bare expression with eval(), which the CSP refuses.
    page.wait_for_function(f"(seen) => {count} > seen", arg=seen, timeout=15_000)


FOCUSED = "() => [document.activeElement.tagName, document.activeElement.textContent.trim()]"


def test_focus_on_a_button_or_link_of_the_job_page_comes_back_after_each_refresh(team, open_page, audit):
    job = JobFactory(team=team, name="waits", state="queued")
    page = open_page()
    sign_in(page, "mia")
    page.goto(f"/jobs/{job.id}/")
    watch_swaps(page)
    for role, name, tag in (("button", "Cancel job", "BUTTON"), ("link", "Re-run…", "A")):
        page.get_by_role(role, name=name).focus()
        page.evaluate("window.__before = document.activeElement")
        wait_for_next(page, f"job-{job.id}-live")
        assert page.evaluate("document.activeElement !== window.__before"), "the fragment was not swapped"
        assert page.evaluate(FOCUSED) == [tag, name], f"focus on {name!r} was lost to the refresh"
    audit.assert_clean()


def test_focus_on_a_link_of_the_jobs_list_and_of_the_queue_comes_back_after_each_refresh(
    team, open_page, audit
):
    job = JobFactory(team=team, name="waits", state="queued")
    page = open_page()
    sign_in(page, "mia")
    for url, target, name in (
        ("/jobs/", "job-list-rows", "waits"),
        ("/jobs/queue/", "queue-rows", f"#{job.id} waits"),
    ):
        page.goto(url)
        watch_swaps(page)
        link = page.locator(f"#{target}").get_by_role("link", name=name, exact=True)
        link.focus()
        page.evaluate("window.__before = document.activeElement")
        wait_for_next(page, target)
        assert page.evaluate("document.activeElement !== window.__before"), (
            f"{url}: the rows were not swapped"
        )
        assert page.evaluate(FOCUSED) == ["A", name], f"{url}: focus on the link was lost to the refresh"
        assert page.evaluate("document.activeElement.getAttribute('href')") == f"/jobs/{job.id}/"
    audit.assert_clean()


SELECT_LOG = """(log) => {
  const range = document.createRange();
  range.selectNodeContents(log);
  getSelection().removeAllRanges();
  getSelection().addRange(range);
  window.__log = log;
}"""


def test_text_selected_in_the_log_is_not_cleared_by_a_poll_and_the_polls_swap_again_once_it_is_gone(
    team, open_page, audit
):
    job = JobFactory(team=team, name="chatty", state="queued", log_tail="step 1\nstep 2\nstep 3")
    page = open_page()
    sign_in(page, "mia")
    page.goto(f"/jobs/{job.id}/")
    watch_swaps(page)
    live = f"job-{job.id}-live"
    page.locator(f"#job-{job.id}-log").evaluate(SELECT_LOG)
    for _ in range(2):  # two polls come and go while the text stays selected
        wait_for_next(page, live, settled=False)
        assert page.evaluate("getSelection().toString()") == "step 1\nstep 2\nstep 3", "a poll cleared it"
        assert page.evaluate(f"document.getElementById('job-{job.id}-log') === window.__log")

    page.evaluate("getSelection().removeAllRanges()")
    wait_for_next(page, live)
    assert page.evaluate(f"document.getElementById('job-{job.id}-log') !== window.__log"), (
        "the polls did not swap the fragment again once nothing was selected"
    )
    audit.assert_clean()


def test_a_filter_the_reader_changes_swaps_the_rows_even_with_text_selected_in_them(team, open_page, audit):
    """Only polls wait for a selection to go: what the reader asked for is shown at once."""
    JobFactory(team=team, name="waits", state="queued")
    JobFactory(team=team, name="finished-job", state="released", end_reason="succeeded")
    page = open_page()
    sign_in(page, "mia")
    page.goto("/jobs/")
    page.locator("#job-list-rows table").evaluate(SELECT_LOG)
    page.get_by_label("State").select_option("queued")
    expect(page.locator("#job-list-rows")).not_to_contain_text("finished-job")
    audit.assert_clean()
