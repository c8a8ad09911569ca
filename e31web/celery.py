"""The Celery application shared by the control worker, beat and every node agent."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "e31web.settings")

app = Celery("e31web")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
