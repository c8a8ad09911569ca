"""A real Chromium (Debian's) driven by Playwright against pytest-django's live server.

Without Chromium these tests are skipped with the reason, unless E31_REQUIRE_BROWSER=1 (CI sets
it), where a missing browser fails. Each page visited is screenshotted under
test-artifacts/screenshots/ and audited with axe-core (node_modules/, installed by `make test`).
"""

import json
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from jobs.models import JobArray
from tests.e2e.conftest import live_pool  # noqa: F401  (a real control worker, beat and two node agents)
from tests.factories import JobFactory, MembershipFactory, TeamFactory, UserFactory

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-artifacts" / "screenshots"
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]  # fmt: skip


def _missing(what: str) -> None:
    if os.environ.get("E31_REQUIRE_BROWSER") == "1":
        pytest.fail(f"E31_REQUIRE_BROWSER=1 but {what}")
    pytest.skip(f"{what} (set E31_REQUIRE_BROWSER=1 to make this a failure)")


def _chromium() -> str:
    """Debian's Chromium (E31_CHROMIUM names another binary); Playwright's own download is never used."""
    found = os.environ.get("E31_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(found).is_file():
        _missing(f"Chromium is not installed at {found} (apt-get install chromium)")
    return found


@pytest.fixture(scope="session")
def chromium():
    """One browser for the session. Playwright's sync API runs an event loop in this thread, so
    Django's guard against database calls from async code must be lifted for these tests."""
    path = _chromium()
    if not AXE.exists():
        _missing(f"axe-core is not installed at {AXE.relative_to(ROOT)} (npm ci)")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield browser
        browser.close()
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


@dataclass
class Audit:
    """What every page showed: CSP refusals and script errors, and axe-core's violations by impact."""

    csp_refusals: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    serious: list[str] = field(default_factory=list)
    by_impact: Counter = field(default_factory=Counter)
    pages: int = 0

    def check(self, page, name: str) -> None:
        """Screenshot the page, then run axe-core over it."""
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
        violations = page.evaluate(
            "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
        )
        self.pages += 1
        counts = Counter(v["impact"] for v in violations)
        self.by_impact.update(counts)
        found = ", ".join(f"{v['id']} ({v['impact']})" for v in violations)
        print(f"axe {name}: {found or 'no violations'}")
        for v in violations:
            if v["impact"] in ("serious", "critical"):
                targets = [n["target"] for n in v["nodes"]][:3]
                self.serious.append(f"{name}: {v['id']} ({v['impact']}) {v['help']} at {json.dumps(targets)}")

    def assert_clean(self) -> None:
        print(f"axe: {self.pages} pages, violations by impact {dict(self.by_impact)}")
        assert not self.csp_refusals, "\n".join(self.csp_refusals)
        assert not self.errors, "\n".join(self.errors)
        assert not self.serious, "\n".join(self.serious)


@pytest.fixture
def audit() -> Audit:
    return Audit()


@pytest.fixture
def open_page(chromium, live_server, audit) -> Iterator:
    """A fresh context (no cookies) per visitor; the CSP stays on: axe goes in through the
    DevTools protocol (an init script), which the page's policy does not govern."""
    contexts = []

    def new_page():
        context = chromium.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
        context.add_init_script(path=str(AXE))
        context.set_default_timeout(20_000)
        contexts.append(context)
        page = context.new_page()
        page.on("console", lambda m: _console(audit, m))
        page.on("pageerror", lambda exc: audit.errors.append(f"{page.url}: {exc}"))
        return page

    yield new_page
    for context in contexts:
        context.close()


def _console(audit: Audit, message) -> None:
    text = message.text
    if "Content Security Policy" in text or "Content-Security-Policy" in text:
        audit.csp_refusals.append(text)
    elif message.type == "error" and "Failed to load resource" not in text:
        audit.errors.append(text)


@pytest.fixture
def team(transactional_db):
    """Team vision, read by the live server (so not in a test's transaction), with its member mia, its admin
    adele, and olga, an operator."""
    team = TeamFactory(name="vision", slug="vision")
    MembershipFactory(team=team, user=UserFactory(username="mia"))
    MembershipFactory(team=team, user=UserFactory(username="adele"), role="admin")
    UserFactory(username="olga", is_staff=True)
    return team


def queued_array(team, *, size: int = 3) -> JobArray:
    """An array of ``size`` queued tasks: the pages that show it poll while they wait."""
    array = JobArray.objects.create(
        team=team, name="sweep", spec=f"0-{size - 1}", size=size, max_running=None, first_index=0,
        submitted_at=datetime.now(UTC),
    )  # fmt: skip
    for index in range(size):
        JobFactory(team=team, name="sweep", state="queued", array=array, array_index=index)
    return array
