"""The one operator guard: visitors sign in, other signed-in users get 404 (never 403), each refusal logged once."""

import logging

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db

# One operator page from each app that has them: they all answer the same way.
OPERATOR_PAGES = [
    ("problem-new", {}),
    ("partners-review", {}),
    ("operations:pool", {}),
    ("metering:check", {}),
    ("jobs:transfers", {}),
]


@pytest.mark.parametrize(("name", "kwargs"), OPERATOR_PAGES)
def test_a_member_finds_no_operator_page_and_the_refusal_is_logged_once(member_client, caplog, name, kwargs):
    caplog.set_level(logging.WARNING, logger="e31.denials")
    url = reverse(name, kwargs=kwargs)
    assert member_client.get(url).status_code == 404
    denials = [r for r in caplog.records if r.name == "e31.denials"]
    assert [(r.status, r.path, r.user, r.reason) for r in denials] == [(404, url, "alice", "not an operator")]


@pytest.mark.parametrize(("name", "kwargs"), OPERATOR_PAGES)
def test_a_visitor_is_sent_to_sign_in_and_an_operator_gets_the_page(client, operator_client, name, kwargs):
    url = reverse(name, kwargs=kwargs)
    response = client.get(url)
    assert response.status_code == 302 and response["Location"].startswith(reverse("accounts:login"))
    assert operator_client.get(url).status_code == 200
