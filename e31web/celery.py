"""The Celery application shared by the control worker, beat and every node agent."""

import os

from celery import Celery, signals
from django.db import connection

from common import schema

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "e31web.settings")

app = Celery("e31web")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# A worker or beat whose code and the database's migrations disagree does not start: its tasks would read and
# write rows shaped for another schema.
@signals.worker_init.connect
def refuse_a_worker_on_another_schema(**kwargs) -> None:
    schema.refuse_to_start("worker", connection)


@signals.beat_init.connect
def refuse_beat_on_another_schema(**kwargs) -> None:
    schema.refuse_to_start("beat", connection)
