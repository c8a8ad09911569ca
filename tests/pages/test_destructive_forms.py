"""Every form whose button destroys something asks first (data-confirm, asked by static/js/console.js)."""

import re
from pathlib import Path

import pytest

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
FORM = re.compile(r"<form\b(?P<attrs>[^>]*)>(?P<body>.*?)</form>", re.S)
# A form of its own with a note to write first, on a page of one application: the writing is the asking.
ASKS_BY_ITS_FORM = {("pages/partners_application.html", "partners-decline")}


def _danger_forms():
    for path in sorted(TEMPLATES.rglob("*.html")):
        name = str(path.relative_to(TEMPLATES))
        for form in FORM.finditer(path.read_text()):
            exempt = any(name == t and f"'{url}'" in form["attrs"] for t, url in ASKS_BY_ITS_FORM)
            if 'class="danger' in form["body"] and not exempt:
                yield name, form["attrs"]


@pytest.mark.parametrize(("template", "attrs"), list(_danger_forms()))
def test_a_form_that_destroys_asks_first(template, attrs):
    """Delete a secret, revoke a token, remove a member or leave the team, cancel an invitation: each acted on one
    click, where Cancel job asked."""
    assert "data-confirm=" in attrs, f"{template}: {attrs.strip()[:120]}"
