"""Every page names its icon (without one a browser asks for /favicon.ico at each load: a 404), and a
cancelled job's page reads clearly: its greyed steps still meet WCAG AA contrast (axe-core, serious)."""

import pytest

from tests.browser.test_journeys import sign_in
from tests.factories import JobFactory

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

# Headless Chromium fetches no icon itself: the page draws it, as a tab would (img-src 'self' allows it).
DRAWS = """(href) => new Promise((done) => {
  const image = new Image();
  image.onload = () => done(image.naturalWidth);
  image.onerror = () => done(0);
  image.src = href;
})"""


def test_each_page_names_an_svg_icon_that_loads(team, open_page, audit):
    page = open_page()
    page.goto("/")
    icons = page.locator("link[rel='icon']")
    assert icons.count() == 1, "the page names no icon: the browser asks for /favicon.ico, a 404"
    href = icons.get_attribute("href")
    answer = page.request.get(href)
    assert answer.status == 200 and answer.headers["content-type"].startswith("image/svg+xml"), href
    assert page.evaluate(DRAWS, href) > 0, "the icon does not draw"
    sign_in(page, "mia")
    for url in ("/jobs/", "/jobs/new/", "/no/such/page/"):
        page.goto(url)
        assert page.locator("link[rel='icon']").get_attribute("href") == href, url
    audit.assert_clean()


def test_a_cancelled_jobs_greyed_steps_meet_aa_contrast(team, open_page, audit):
    job = JobFactory(team=team, name="stopped", state="ended", end_reason="cancelled")
    page = open_page()
    sign_in(page, "mia")
    page.goto(f"/jobs/{job.id}/")
    never = page.locator(".timeline .never strong", has_text="Output")
    assert never.count() == 1, "the Output step is not shown as never reached"
    audit.check(page, "job-cancelled")
    audit.assert_clean()
