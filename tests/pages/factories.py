"""Factories for the public record and intake. Problems are made through the service, so each has its revision."""

import factory
from django.utils import timezone

from public import services
from public.models import Application, Problem, WaitlistEntry


class ProblemFactory(factory.Factory):
    class Meta:
        model = Problem

    title = factory.Sequence(lambda n: f"Test problem {n}")
    summary = "A short summary of the problem."
    why_hard = "It is hard for reasons."
    open_questions = factory.LazyFunction(lambda: ["What would a good answer be?"])
    measurement_keys = factory.LazyFunction(list)
    author = "olga"
    now = factory.LazyFunction(timezone.now)

    @classmethod
    def _create(cls, model_class, **kwargs) -> Problem:
        return services.add_problem(**kwargs)


class WaitlistEntryFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = WaitlistEntry

    email = factory.Sequence(lambda n: f"wait{n}@example.com")
    note = ""
    created_at = factory.LazyFunction(timezone.now)


class ApplicationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Application

    team_name = factory.Sequence(lambda n: f"Footage Lab {n}")
    contact_name = "Carla Contact"
    email = factory.Sequence(lambda n: f"carla{n}@example.com")
    work = "python render.py --backlog"
    data_bytes = 40 * 10**12
    data_location = "object storage in our own account"
    compute_request = "8 GPUs for 6 hours"
    output = "processed clips"
    output_bytes = 2 * 10**12
    can_run_when = "any weekend next month"
    created_at = factory.LazyFunction(timezone.now)


def application_post(**overrides: str) -> dict[str, str]:
    """A complete, valid application as the browser posts it."""
    data = {
        "form": "application",
        "team_name": "Footage Lab",
        "contact_name": "Carla Contact",
        "email": "carla@example.com",
        "work": "python render.py --backlog",
        "data_bytes": "40 TB",
        "data_location": "object storage in our own account",
        "compute_request": "8 GPUs for 6 hours, can be paused",
        "output": "processed clips",
        "output_bytes": "2 TB",
        "can_run_when": "any weekend next month",
        "website": "",
    }
    return {**data, **overrides}
