"""An array's page offers "Cancel every live task" only while it has one: once every task has ended the
button would do nothing but say so."""

import pytest

from jobs.models import Job
from tests.jobs.intake_channels import submit_api

pytestmark = pytest.mark.django_db

BUTTON = "Cancel every live task"


@pytest.fixture
def raw(roots):
    _, out_root = roots
    return {
        "name": "sweep",
        "array": "0-2",
        "work": {"argv": ["python3", "sweep.py"]},
        "request": {"gpus": 1, "hours": 1.0},
        "output": {"uri": f"file://{out_root}/sweep", "bytes": 100},
    }


def test_the_button_is_offered_while_a_task_lives_and_not_once_every_task_has_ended(
    member_client, client, member_token, pool, raw
):
    array_id = submit_api(client, raw, member_token).json()["array"]["id"]
    assert BUTTON in member_client.get(f"/jobs/?array={array_id}").content.decode()
    Job.objects.filter(array_id=array_id).update(state="released", end_reason="succeeded")
    page = member_client.get(f"/jobs/?array={array_id}").content.decode()
    assert BUTTON not in page and "3 succeeded" in page
