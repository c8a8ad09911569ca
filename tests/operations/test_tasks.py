"""Beat runs the dashboard's periodic tasks: beat's heartbeat, a utilisation sample a minute, the ledger check."""

import pytest
from django.conf import settings

from e31web.celery import app
from operations import tasks
from operations.models import HealthProbe, UtilisationSample


def test_beat_schedules_each_dashboard_task_and_each_is_registered():
    entries = {e["task"]: e["schedule"] for e in settings.CELERY_BEAT_SCHEDULE.values()}
    assert entries["operations.tasks.sample_utilisation"] == 60.0
    assert entries["operations.tasks.beat_heartbeat"] <= 30.0
    assert "operations.tasks.check_ledger" in entries
    app.loader.import_default_modules()
    assert {"operations.tasks.sample_utilisation", "operations.tasks.beat_heartbeat"} <= set(app.tasks)


@pytest.mark.django_db
def test_the_tasks_write_a_sample_a_heartbeat_and_a_ledger_verdict(pool):
    tasks.sample_utilisation()
    tasks.beat_heartbeat()
    tasks.check_ledger()
    assert UtilisationSample.objects.get().total_gpus == 8
    assert set(HealthProbe.objects.values_list("name", "ok")) == {("beat", True), ("ledger", True)}
