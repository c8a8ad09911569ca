"""The Celery application shared by the control worker, beat and every node agent."""

import os

from celery import Celery, signals
from django.db import connection

from common import schema

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "e31web.settings")

app = Celery("e31web")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.worker_init.connect
def refuse_a_worker_on_another_schema(**kwargs) -> None:
    _refuse_another_schema("worker")


@signals.beat_init.connect
def refuse_beat_on_another_schema(**kwargs) -> None:
    _refuse_another_schema("beat")


def _refuse_another_schema(what: str) -> None:
    """A worker or beat whose code and the database's migrations disagree does not start: its tasks would read and
    write rows shaped for another schema. An exit, not an exception: Celery logs a receiver's exception and goes on."""
    if reason := schema.check(connection):
        raise SystemExit(f"{what} not started: {reason}")
