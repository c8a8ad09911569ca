"""`make run` creates the demo operator and member, each with a password of its own, printed once."""

import re
from io import StringIO

import pytest
from django.contrib.auth import authenticate
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def test_each_demo_user_gets_a_password_of_its_own(settings):
    settings.E31_DEMO_PASSWORD = ""
    out = StringIO()
    call_command("ensure_demo_accounts", stdout=out)
    printed = dict(re.findall(r"created '(\w+)' with password (\S+)", out.getvalue()))
    assert set(printed) == {"operator", "demo"}
    assert printed["operator"] != printed["demo"]
    for username, password in printed.items():
        assert authenticate(username=username, password=password) is not None


def test_a_second_start_changes_no_password(settings):
    settings.E31_DEMO_PASSWORD = ""
    call_command("ensure_demo_accounts", stdout=StringIO())
    out = StringIO()
    call_command("ensure_demo_accounts", stdout=out)
    assert "with password" not in out.getvalue() and "unchanged" in out.getvalue()
