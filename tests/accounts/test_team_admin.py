"""A team's slug names its folders of every data and output root and its S3 prefixes: once the team
exists, the admin shows it but cannot change it (a renamed slug would leave the old folders to
whichever team is later given that name)."""

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_a_teams_slug_cannot_be_changed_in_the_admin(admin_client, team):
    url = reverse("admin:accounts_team_change", args=[team.id])
    page = admin_client.get(url).content.decode()
    assert 'name="slug"' not in page and "vision" in page
    form = {"name": "Vision renamed", "slug": "audio", "share": "1", "egress_allowed": "",
            "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"}  # fmt: skip
    assert admin_client.post(url, form).status_code == 302  # saved
    team.refresh_from_db()
    assert (team.name, team.slug) == ("Vision renamed", "vision")


def test_a_new_team_still_gets_its_slug_from_its_name(admin_client):
    page = admin_client.get(reverse("admin:accounts_team_add")).content.decode()
    assert 'name="slug"' in page
