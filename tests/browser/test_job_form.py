"""The submit form in a real browser: what the user pasted is never lost to an error."""

import pytest
from playwright.sync_api import expect

from jobs.models import Job
from tests.browser.test_journeys import sign_in
from tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

BROKEN = 'name = "train"\n[work\nargv = ["python3", "train.py"]\n'
INVALID = 'name = "train"\n[work]\nargv = ["python3", "train.py"]\n[request]\ngpus = 0\nhours = 1\n'


@pytest.fixture
def member(transactional_db):
    team = TeamFactory(name="vision", slug="vision")
    return MembershipFactory(team=team, user=UserFactory(username="alice")).user


@pytest.mark.parametrize(
    ("pasted", "error"), [(BROKEN, "not valid TOML"), (INVALID, "Nothing was submitted")]
)
def test_a_pasted_job_file_submitted_with_an_error_is_still_in_the_textarea(
    member, open_page, audit, pasted, error
):
    page = open_page()
    sign_in(page, "alice")
    page.goto("/jobs/new/")
    page.get_by_text("Fill the form from a job file (TOML)").click()
    page.locator("textarea[name='job_file']").fill(pasted)
    page.get_by_role("button", name="Submit this file as it is").click()
    expect(page.locator("main")).to_contain_text(error)
    expect(page.locator("textarea[name='job_file']")).to_be_visible()
    expect(page.locator("textarea[name='job_file']")).to_have_value(pasted)
    assert not Job.objects.exists()
    audit.check(page, "job-file-error")
    audit.assert_clean()
