"""A destructive button asks first, in words that say what will happen: dismissing the question leaves
everything as it was, accepting it does the deed. The question is the browser's own dialog, opened by
static/js/console.js from the form's data-confirm (the CSP allows no inline handler)."""

import pytest
from playwright.sync_api import expect

from jobs.models import Job
from notifications.models import Webhook
from tests.browser.conftest import queued_array
from tests.browser.test_journeys import sign_in
from tests.factories import JobFactory, UserFactory, WebhookFactory

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]


def press(page, button, *, accept: bool) -> str:
    """Presses ``button``, answers the dialog it opens, and returns the dialog's question ("" if none opened)."""
    asked = []

    def answer(dialog):
        asked.append(dialog.message)
        dialog.accept() if accept else dialog.dismiss()

    page.once("dialog", answer)
    button.click()
    page.evaluate("1")  # a round trip: the click's submit handlers have run
    if not asked:
        page.remove_listener("dialog", answer)
    return asked[0] if asked else ""


def no_posts_to(page, path_part: str) -> list[str]:
    posts = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" and path_part in r.url else None)
    return posts


def test_cancel_job_asks_first_and_a_dismissed_question_leaves_the_job_waiting(team, open_page, audit):
    job = JobFactory(team=team, name="train", state="queued")
    page = open_page()
    sign_in(page, "adele")
    page.goto(f"/jobs/{job.id}/")
    posts = no_posts_to(page, "/cancel/")
    question = press(page, page.get_by_role("button", name="Cancel job"), accept=False)
    assert question, "Cancel job acted on one click, without asking"
    assert f"#{job.id}" in question and "train" in question and "GPU" in question, question
    assert not posts and Job.objects.get(id=job.id).state == "queued"
    expect(page.get_by_role("button", name="Cancel job")).to_be_visible()

    assert press(page, page.get_by_role("button", name="Cancel job"), accept=True) == question
    expect(page.locator(".messages")).to_contain_text(f"Job #{job.id}: cancel requested.")
    assert Job.objects.get(id=job.id).end_reason == "cancelled"
    audit.assert_clean()


def test_a_running_jobs_question_says_its_process_is_stopped_and_its_gpus_released(team, open_page, audit):
    job = JobFactory(team=team, name="train", state="running")
    page = open_page()
    sign_in(page, "adele")
    page.goto(f"/jobs/{job.id}/")
    question = press(page, page.get_by_role("button", name="Cancel job"), accept=False)
    assert "TERM" in question and "KILL" in question and "GPUs are released" in question, question
    assert Job.objects.get(id=job.id).cancel_requested_at is None
    audit.assert_clean()


def test_cancel_every_live_task_asks_first(team, open_page, audit):
    array = queued_array(team)
    tasks = list(Job.objects.filter(array=array))
    page = open_page()
    sign_in(page, "adele")
    page.goto(f"/jobs/?array={array.id}")
    posts = no_posts_to(page, "/cancel/")
    button = page.get_by_role("button", name="Cancel every live task")
    question = press(page, button, accept=False)
    assert question, "Cancel every live task acted on one click, without asking"
    assert f"array {array.id}" in question and "3 live tasks" in question, question
    assert not posts and set(Job.objects.filter(array=array).values_list("state", flat=True)) == {"queued"}

    assert press(page, button, accept=True) == question
    expect(page.locator(".messages")).to_contain_text(f"Array {array.id}: cancel requested for 3 live tasks.")
    assert {Job.objects.get(id=t.id).end_reason for t in tasks} == {"cancelled"}
    audit.assert_clean()


def test_removing_a_webhook_asks_first(team, open_page, audit):
    hook = WebhookFactory(
        team=team, url="https://hooks.example/e31", created_by=UserFactory(username="adele")
    )
    page = open_page()
    sign_in(page, "adele")
    page.goto("/notifications/webhooks/vision/")
    posts = no_posts_to(page, "/remove/")
    button = page.locator(f"#webhook-{hook.id}").get_by_role("button", name="Remove")
    question = press(page, button, accept=False)
    assert question, "Remove acted on one click, without asking"
    assert "https://hooks.example/e31" in question and "deliveries" in question, question
    assert not posts and Webhook.objects.filter(id=hook.id).exists()

    assert press(page, button, accept=True) == question
    expect(page.locator(".messages")).to_contain_text("Webhook removed.")
    assert not Webhook.objects.filter(id=hook.id).exists()
    audit.assert_clean()
