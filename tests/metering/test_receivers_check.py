"""An enforced budget is never skipped in silence: a project whose metering receivers are not connected fails its checks."""

from django.core import checks

from jobs import signals
from metering import checks as metering_checks
from metering import receivers


def test_the_project_starts_with_metering_listening():
    errors = [e for e in checks.run_checks() if e.id == "metering.E001"]
    assert errors == []


def test_a_budget_nobody_answers_is_an_error_at_startup():
    assert signals.budget_asked.disconnect(dispatch_uid="metering.budget")
    try:
        errors = checks.run_checks()
    finally:
        signals.budget_asked.connect(receivers.answer_budget, dispatch_uid="metering.budget")
    assert [e.id for e in errors if "metering.budget" in e.msg] == ["metering.E001"]
    assert metering_checks.receivers_connected() == []
