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


@pytest.mark.django_db
def test_opening_intake_and_allowing_egress_ask_first_saying_what_follows(operator_client, team):
    """An operator walk: "Open intake" e-mailed the whole waitlist, and "Allow internet egress" let every job of a
    team reach the internet, each on one click."""
    from django.urls import reverse
    from django.utils import timezone

    from public.models import WaitlistEntry

    for n in range(3):
        WaitlistEntry.objects.create(email=f"w{n}@example.com", created_at=timezone.now())
    review = operator_client.get(reverse("partners-review")).content.decode()
    assert (
        'data-confirm="Open design-partner intake? Visitors see the application form, and 3 people' in review
    )
    team_page = operator_client.get(reverse("operations:team", args=[team.slug])).content.decode()
    assert f"data-confirm=\"Allow team {team.name}'s jobs to reach the internet?" in team_page
