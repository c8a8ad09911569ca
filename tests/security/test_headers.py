"""Every HTML page the console serves carries the security headers, and nothing the CSP would refuse."""

from html.parser import HTMLParser

import pytest

from tests.security.matrix import cases_for, is_api, request
from tests.security.routes import all_routes

pytestmark = pytest.mark.django_db

CSP = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self' data:",
    "object-src": "'none'",
    "frame-ancestors": "'none'",
    "base-uri": "'self'",
    "form-action": "'self'",
}
HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def parse_csp(header: str) -> dict[str, str]:
    directives = (part.strip().split(" ", 1) for part in header.split(";") if part.strip())
    return {d[0]: d[1] if len(d) > 1 else "" for d in directives}


class InlineFinder(HTMLParser):
    """Collects what a strict CSP blocks: inline scripts and styles, style= and on*= attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        if tag == "script" and not names.get("src") and names.get("type") not in ("application/json",):
            self.found.append("<script> without src")
        if tag == "style":
            self.found.append("<style> element")
        self.found += [f"<{tag} {n}=…>" for n in names if n == "style" or n.startswith("on")]


def inline_parts(html: str) -> list[str]:
    finder = InlineFinder()
    finder.feed(html)
    return finder.found


def _html_pages(world):
    """(label, response) for every GET route answered with HTML, as a visitor, a member and an operator."""
    for route in all_routes():
        if is_api(route) and not route.key.endswith("openapi-view"):
            continue
        for case in cases_for(route):
            if case.method != "GET":
                continue
            for visitor in ("anonymous", "member_a", "operator"):
                response = request(world, visitor, route, case)
                if response.get("Content-Type", "").startswith("text/html"):
                    yield f"{route.key} as {visitor} ({response.status_code})", response


def test_every_html_page_sends_the_security_headers_and_holds_nothing_the_csp_would_refuse(world):
    problems, pages = [], 0
    for label, response in _html_pages(world):
        pages += 1
        if parse_csp(response.get("Content-Security-Policy", "")) != CSP:
            problems.append(f"{label}: CSP {response.get('Content-Security-Policy')!r}")
        problems += [f"{label}: {h}={response.get(h)!r}" for h, v in HEADERS.items() if response.get(h) != v]
        problems += [f"{label}: {part}" for part in inline_parts(response.content.decode())]
    print(f"security headers: {pages} HTML responses checked")
    assert pages > 50 and not problems, "\n".join(sorted(set(problems)))


def test_the_htmx_config_turns_off_its_injected_indicator_styles(client):
    html = client.get("/").content.decode()
    assert '"includeIndicatorStyles":false' in html
