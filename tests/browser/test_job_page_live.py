"""The job page in a real browser tells the truth live: everything on it that can change changes
without a reload, and it stops asking once the job has ended and its outputs are delivered."""

import json
import re
import time

import pytest
from playwright.sync_api import expect

from jobs.models import Job
from tests.browser.test_journeys import sign_in
from tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.timeout(180)]

WRITES_A_RESULT = (
    "import os, time; time.sleep(2); print('working');"
    " open(os.environ['E31_OUTPUT_DIR'] + '/result.txt', 'w').write('42')"
)


@pytest.fixture
def member(live_pool):
    team = TeamFactory(name="vision", slug="vision")
    return MembershipFactory(team=team, user=UserFactory(username="alice")).user


def submit_from_the_form(page, output_root) -> int:
    page.goto("/jobs/new/")
    page.locator("input[name='name']").fill("live-page")
    page.locator("textarea[name='work.argv']").fill(f"/usr/bin/python3\n-c\n{WRITES_A_RESULT}")
    page.locator("input[name='output.uri']").fill(f"file://{output_root}/live-page")
    page.locator("input[name='output.bytes']").fill("1 KB")
    page.get_by_role("button", name="Submit the job").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def test_the_job_page_changes_everything_live_and_stops_polling_once_final_and_delivered(
    live_pool, member, open_page, audit, settings
):
    page = open_page()
    sign_in(page, "alice")
    polls = []
    page.on("request", lambda r: polls.append(r.url) if "/live/" in r.url else None)
    job_id = submit_from_the_form(page, settings.E31_OUTPUT_ROOTS[0] / "vision")
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads
    # Read at once, before the first poll (2 s) can swap it: the job sleeps 2 s, so it is still alive here.
    assert page.locator(f"#job-{job_id}-badge").inner_text() in (
        "submitted",
        "staging",
        "queued",
        "rented",
        "running",
    )
    assert page.get_by_role("button", name="Cancel job").count() == 1

    expect(page.locator(f"#job-{job_id}-badge")).to_have_text("succeeded", timeout=60_000)
    expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)
    meter = page.locator(f"#job-{job_id}-meter")
    expect(meter).not_to_contain_text("Not metered")
    expect(meter).to_contain_text("Stopped")
    events = page.locator(f"#job-{job_id}-events")
    for state in ("staging", "queued", "rented", "running", "output", "released"):
        expect(events).to_contain_text(state)
    expect(page.locator(f"#job-{job_id}-live")).to_contain_text("delivered", timeout=30_000)
    download = page.locator(f"#job-{job_id}-files").get_by_role("link", name="result.txt")
    expect(download).to_be_visible()
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded instead of updating live"
    assert Job.objects.get(id=job_id).delivery_state == "delivered"
    audit.check(page, "job-live-final")

    time.sleep(2.5)  # one poll may have been in flight when the last fragment came back
    seen = len(polls)
    assert seen > 0, "the page never polled its live fragment: its stopping would prove nothing"
    time.sleep(5)  # the page polled every 2 s while the job was alive
    assert len(polls) == seen, "the page kept polling a job that has ended and delivered its outputs"

    with page.expect_download() as downloaded:
        download.click()
    assert open(downloaded.value.path()).read() == "42"
    audit.assert_clean()


def test_a_meter_table_the_reader_opened_stays_open_while_the_page_polls(
    live_pool, member, open_page, settings
):
    page = open_page()
    sign_in(page, "alice")
    page.goto("/jobs/new/")
    page.locator("input[name='name']").fill("long-enough")
    page.locator("textarea[name='work.argv']").fill("/usr/bin/python3\n-c\nimport time; time.sleep(12)")
    page.locator("input[name='output.uri']").fill(f"file://{settings.E31_OUTPUT_ROOTS[0] / 'vision'}/long")
    page.locator("input[name='output.bytes']").fill("1 KB")
    page.get_by_role("button", name="Submit the job").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    rows = page.locator(f"#job-{job_id}-meter details").first
    expect(rows).to_be_attached(timeout=30_000)  # the meter card gains its part once GPUs are rented
    rows.locator("summary").click()
    expect(rows).to_have_attribute("open", "")
    with page.expect_response(re.compile(r"/live/")):  # the next poll swaps the whole live fragment
        pass
    page.wait_for_timeout(300)  # the swap settles
    assert Job.objects.get(id=job_id).is_alive, "the job ended before a poll could be watched"
    expect(page.locator(f"#job-{job_id}-meter details").first).to_have_attribute("open", "")


AT_THE_END = "(log) => log.scrollTop + log.clientHeight >= log.scrollHeight - 2"


def test_the_log_shows_its_latest_lines_and_a_reader_who_scrolled_up_stays_there_while_it_polls(
    live_pool, member, open_page, settings
):
    """The log's last lines fill a box a dozen lines high: it opens at its end, where the latest line is,
    and each poll keeps it there; a reader who scrolled up to read an earlier line is not thrown back."""
    page = open_page()
    sign_in(page, "alice")
    page.goto("/jobs/new/")
    page.locator("input[name='name']").fill("chatty")
    program = "import time\nfor i in range(200): print(f'step {i}', flush=True)\ntime.sleep(20)"
    page.locator("textarea[name='work.argv']").fill(f'["/usr/bin/python3", "-c", {json.dumps(program)}]')
    page.locator("input[name='output.uri']").fill(f"file://{settings.E31_OUTPUT_ROOTS[0] / 'vision'}/chatty")
    page.locator("input[name='output.bytes']").fill("1 KB")
    page.get_by_role("button", name="Submit the job").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    log = page.locator(f"#job-{job_id}-log")
    expect(log).to_contain_text("step 199", timeout=60_000)
    page.reload()  # a fresh page opens at the end too, not only a swapped one
    expect(log).to_contain_text("step 199")
    assert log.evaluate(AT_THE_END), "the log box opened at its oldest lines"
    with page.expect_response(re.compile(r"/live/")):
        pass
    page.wait_for_timeout(300)
    assert log.evaluate(AT_THE_END), "a poll scrolled the log away from its latest lines"

    log.evaluate("(log) => { log.scrollTop = 40; }")
    with page.expect_response(re.compile(r"/live/")):
        pass
    page.wait_for_timeout(300)
    assert Job.objects.get(id=job_id).is_alive, "the job ended before a poll could be watched"
    assert page.locator(f"#job-{job_id}-log").evaluate("(log) => log.scrollTop") == 40
