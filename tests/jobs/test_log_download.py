"""The log download parses its query as ASCII digits only: anything else is a 404, never a 500."""

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs.models import Allocation
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("query", [{"rank": "²"}, {"attempt": "\u0661"}, {"rank": "\u0663"}, {"rank": "-1"}])
def test_a_digit_that_is_not_ascii_is_no_such_log(query, team, member_client):
    job = JobFactory(team=team, state="running", attempt=1)
    response = member_client.get(reverse("jobs:log", args=[job.id]), query)
    assert response.status_code == 404


@pytest.mark.parametrize("index", ["²", "\u0663"])  # int() refuses the first and reads the second as 3
def test_a_removed_row_index_that_is_not_ascii_leaves_the_form_whole(index, team, member_client):
    rows = {f"data[{i}].name": name for i, name in enumerate("abcd")}
    response = member_client.post(
        reverse("jobs:new"), {**rows, "action": f"remove-input-{index}", "team": team.id}
    )
    assert response.status_code == 200
    assert [row["name"] for row in response.context["form"].rows] == ["a", "b", "c", "d"]
    assert all(f'value="{name}"' in response.content.decode() for name in "abcd")


@pytest.mark.parametrize("query", [{"attempt": "9" * 5000}, {"rank": "9" * 5000}, {"rank": "9" * 10}])
def test_an_attempt_or_rank_too_long_for_a_number_is_no_such_log(query, team, member_client):
    """int() refuses 4,300 digits or more, and no column holds ten: either is a 404, never a server error."""
    job = JobFactory(team=team, state="released", end_reason="succeeded", attempt=1)
    response = member_client.get(reverse("jobs:log", args=[job.id]), query)
    assert response.status_code == 404


@pytest.mark.parametrize("query", [{"attempt": "999999999"}, {"rank": "999999999"}])
def test_an_attempt_or_rank_that_never_was_is_no_such_log(query, team, member_client):
    """The page's download answered an empty 200 where the API's log answers 404: an empty file reads as a job
    that printed nothing."""
    job = JobFactory(team=team, state="released", end_reason="succeeded", attempt=1)
    Allocation.objects.create(
        job=job, attempt=1, node=NodeFactory(), gpu_indices=[0], rented_at=timezone.now()
    )
    response = member_client.get(reverse("jobs:log", args=[job.id]), query)
    assert response.status_code == 404
