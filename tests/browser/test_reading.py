"""Pages that read well in a real browser: one clear menu each for members and operators, usable
at 390 px, a copy button for a new token, the job list's filter in the URL, and every page
screenshotted at 1,280 px and 390 px and audited by axe-core. No pool runs: the rows are made here."""

import re

import pytest
from playwright.sync_api import expect

from jobs.models import Job
from tests.browser.test_journeys import sign_in
from tests.factories import JobFactory, MembershipFactory, NodeFactory, TeamFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]
PHONE = {"width": 390, "height": 844}


@pytest.fixture
def people(transactional_db):
    """A member, and an operator who is also a member of the same team (as `make run` makes them)."""
    team = TeamFactory(name="vision", slug="vision")
    MembershipFactory(team=team, user=UserFactory(username="mia"))
    MembershipFactory(team=team, user=UserFactory(username="operator", is_staff=True))
    NodeFactory(name="local-1")
    NodeFactory(name="local-2", state="draining")
    jobs = [
        JobFactory(team=team, name="queued-job", state="queued", gpus=2,
                   pending_reason="waiting for 2 GPUs: every GPU of the pool is held by running jobs"),
        JobFactory(team=team, name="finished-job", state="released", end_reason="succeeded", attempt=1),
    ]  # fmt: skip
    return team, jobs


def _nav_links(page) -> list[str]:
    return [t.strip() for t in page.locator("header.top nav a").all_inner_texts()]


@pytest.mark.parametrize("username", ["mia", "operator"])
def test_each_person_sees_one_menu_on_one_row_with_no_link_twice(people, open_page, audit, username):
    page = open_page()
    sign_in(page, username)
    page.goto("/operator/pool/" if username == "operator" else "/jobs/")
    links = _nav_links(page)
    assert len(links) == len(set(links)), f"a link appears twice: {links}"
    assert page.locator("nav").count() <= 2, "one menu (plus the pager at most)"
    tops = {
        round(box["y"])
        for box in (a.bounding_box() for a in page.locator("header.top a, header.top button").all())
        if box
    }
    if max(tops) - min(tops) >= 12:
        audit.check(page, f"menu-{username}-1280-wrapped")
    assert max(tops) - min(tops) < 12, f"the header wraps onto several rows at 1,280 px: {sorted(tops)}"
    who = page.locator(".who").inner_text()
    words = re.findall(r"\w+", who.replace("Sign out", ""))
    assert len(words) == len(set(words)), f"the user label repeats itself: {who!r}"
    audit.check(page, f"menu-{username}-1280")
    audit.assert_clean()


def test_at_390_px_the_menu_opens_from_a_button_and_tables_scroll_in_their_own_box(people, open_page, audit):
    page = open_page()
    page.set_viewport_size(PHONE)
    sign_in(page, "operator")
    for url in ("/jobs/", "/operator/pool/", "/operator/jobs/", "/ledger/"):
        page.goto(url)
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{url} scrolls sideways by {overflow} px at 390 px"
    menu = page.get_by_role("button", name="Menu")
    nav = page.locator("header.top nav")
    expect(menu).to_be_visible()
    expect(nav).to_be_hidden()
    menu.click()
    expect(nav).to_be_visible()
    expect(menu).to_have_attribute("aria-expanded", "true")
    audit.check(page, "menu-open-390")
    audit.assert_clean()


def test_a_new_token_is_copied_with_one_click(people, open_page, audit):
    page = open_page()
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    sign_in(page, "mia")
    page.goto("/accounts/tokens/")
    page.get_by_label("Label").fill("laptop")
    page.get_by_role("button", name="Create a token").click()
    token = page.locator("pre.token").inner_text().strip()
    page.get_by_role("button", name="Copy the token").click()
    expect(page.locator("#new-token-status")).to_have_text("Copied to the clipboard.")
    assert page.evaluate("navigator.clipboard.readText()") == token
    audit.check(page, "token-copied")
    audit.assert_clean()


def test_the_job_lists_state_filter_is_in_the_url_and_survives_a_reload(people, open_page, audit):
    page = open_page()
    sign_in(page, "mia")
    page.goto("/jobs/")
    page.get_by_label("State").select_option("queued")
    page.wait_for_url(re.compile(r"state=queued"))
    expect(page.locator("#job-list-rows")).not_to_contain_text("finished-job")
    page.reload()
    expect(page.get_by_label("State")).to_have_value("queued")
    expect(page.locator("#job-list-rows")).to_contain_text("queued-job")
    expect(page.locator("#job-list-rows")).not_to_contain_text("finished-job")
    audit.assert_clean()


MEMBER_PAGES = {
    "home": "/", "unsolved": "/unsolved/", "design-partners": "/design-partners/", "jobs": "/jobs/",
    "job-form": "/jobs/new/", "job-page": "/jobs/{job}/", "queue": "/jobs/queue/", "ledger": "/ledger/",
    "tokens": "/accounts/tokens/", "not-found": "/no/such/page/",
}  # fmt: skip
OPERATOR_PAGES = {
    "operator-pool": "/operator/pool/", "operator-queue": "/operator/queue/",
    "operator-utilisation": "/operator/utilisation/", "operator-jobs": "/operator/jobs/",
    "operator-teams": "/operator/teams/", "operator-team": "/operator/teams/vision/",
    "operator-health": "/operator/health/", "operator-audit": "/operator/audit/",
    "operator-partners": "/operator/partners/", "transfers": "/jobs/transfers/",
    "operator-drain": "/operator/pool/nodes/local-1/drain/",
}  # fmt: skip


@pytest.mark.parametrize("width", [1280, 390])
def test_every_page_is_screenshotted_and_audited_at_desktop_and_phone_widths(people, open_page, audit, width):
    _, jobs = people
    page = open_page()
    page.set_viewport_size({"width": width, "height": 900 if width > 500 else 844})
    page.goto("/accounts/login/")
    audit.check(page, f"login-{width}")
    sign_in(page, "operator")
    for name, url in {**MEMBER_PAGES, **OPERATOR_PAGES}.items():
        response = page.goto(url.format(job=jobs[0].id))
        assert response.status == (404 if name == "not-found" else 200), f"{url}: {response.status}"
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{url} scrolls sideways by {overflow} px at {width} px"
        audit.check(page, f"{name}-{width}")
    assert Job.objects.count() == 2
    audit.assert_clean()
