"""Three journeys in a real browser, with the real CSP on: a member's job from form to ledger, an
operator draining a node, a visitor joining the waitlist. Jobs really run (a live pool)."""

import importlib
import re

import pytest
from django.apps import apps
from playwright.sync_api import expect

from jobs.models import Job, Node
from tests.conftest import PASSWORD
from tests.e2e.conftest import wait_for
from tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture
def member(live_pool):
    team = TeamFactory(name="vision", slug="vision")
    return MembershipFactory(team=team, user=UserFactory(username="alice")).user


def sign_in(page, username: str) -> None:
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator(".who")).to_contain_text(username)


def submit_job(page, audit, output_root) -> int:
    page.goto("/jobs/new/")
    audit.check(page, "job-form")
    page.locator("input[name='name']").fill("browser-job")
    argv = "/usr/bin/python3\n-c\nimport time; time.sleep(2); print('hello from the browser job')"
    page.locator("textarea[name='work.argv']").fill(argv)
    page.locator("input[name='output.uri']").fill(f"file://{output_root}/browser-job")
    page.locator("input[name='output.bytes']").fill("1 KB")
    page.get_by_role("button", name="Submit the job").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def test_a_member_submits_a_job_watches_it_reach_released_live_and_finds_it_in_the_ledger(
    live_pool, member, open_page, audit, settings
):
    page = open_page()
    sign_in(page, "alice")
    audit.check(page, "jobs-list")
    job_id = submit_job(page, audit, settings.E31_OUTPUT_ROOTS[0] / "vision")
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads
    live = page.locator(f"#job-{job_id}-live")
    expect(live.locator(".end")).to_contain_text("succeeded", timeout=60_000)  # htmx polls every 2 s
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded instead of updating live"
    expect(live.locator(f"#job-{job_id}-log")).to_contain_text("hello from the browser job")
    assert Job.objects.get(id=job_id).state == "released"
    audit.check(page, "job-released")

    page.reload()  # the meter card sits outside the live part: it is drawn once per page load
    meter = page.locator(f"#job-{job_id}-meter")
    meter.locator("summary").first.click()
    expect(meter.locator("tbody tr").first).to_contain_text("final")
    audit.check(page, "job-meter-rows")

    page.get_by_role("link", name="Ledger", exact=True).click()
    expect(page.locator("main")).to_contain_text(f"#{job_id} browser-job")
    audit.check(page, "team-ledger")
    audit.assert_clean()


def test_an_operator_drains_a_node_and_sees_the_pool_grid_change_without_reloading(
    live_pool, open_page, audit
):
    UserFactory(username="olga", is_staff=True)
    node = live_pool.nodes[0]
    watcher = open_page()
    sign_in(watcher, "olga")
    watcher.goto("/operator/pool/")
    row = watcher.locator("#pool-grid tr", has_text=node)
    expect(row).to_contain_text("up")
    watcher.evaluate("window.__sameDocument = true")
    audit.check(watcher, "operator-pool")

    actor = open_page()
    sign_in(actor, "olga")
    actor.goto(f"/operator/pool/nodes/{node}/drain/")
    audit.check(actor, "operator-drain-confirm")
    actor.get_by_label(f"I confirm: drain {node}").check()
    actor.get_by_role("button", name=f"Drain {node}").click()
    expect(actor.locator("main")).to_contain_text(f"{node} is draining")

    # The first page's grid refreshes itself every 5 s; an idle node drains at the next safety pass.
    expect(row).to_contain_text("drained", timeout=30_000)
    assert watcher.evaluate("window.__sameDocument === true"), (
        "the pool page reloaded instead of updating live"
    )
    assert Node.objects.get(name=node).state == "drained"
    audit.check(watcher, "operator-pool-drained")
    audit.assert_clean()


@pytest.fixture
def published_problems(transactional_db):
    """The data migration's four problems; a transactional test before this one may have flushed them."""
    importlib.import_module("e31web.migrations.0003_seed_problems").seed(apps, None, app_label="public")


def test_a_visitor_reads_what_is_unsolved_and_joins_the_waitlist(published_problems, open_page, audit):
    from public.models import WaitlistEntry

    page = open_page()
    page.goto("/")
    audit.check(page, "home")
    page.get_by_role("link", name="What we have not solved").first.click()
    expect(page.locator("main h2").first).to_be_visible()
    audit.check(page, "unsolved")

    page.get_by_role("link", name="Design partners").first.click()
    audit.check(page, "design-partners")
    page.get_by_label("Email").fill("visitor@example.com")
    page.get_by_role("button", name="Join the waitlist").click()
    page.wait_for_url(re.compile(r"/design-partners/thanks/"))
    audit.check(page, "design-partners-thanks")
    wait_for(lambda: WaitlistEntry.objects.filter(email="visitor@example.com").exists(), what="the entry")
    audit.assert_clean()
