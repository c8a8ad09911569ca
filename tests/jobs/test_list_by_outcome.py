"""A team lists its failed jobs: by how they ended, on the jobs page, the API and `e31 ls`.

The page's State filter offered alive/waiting/finished and the lifecycle's states while its rows say "succeeded",
"failed exit 3", "cancelled by demo": ?state=released mixed all three, and nothing listed the failed ones."""

import pytest

from tests.cli.inprocess import e31
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def ended(team):
    return {
        "good": JobFactory(team=team, name="good", state="released", end_reason="succeeded"),
        "broken": JobFactory(team=team, name="broken", state="released", end_reason="failed", exit_code=3),
        "stopped": JobFactory(team=team, name="stopped", state="ended", end_reason="cancelled"),
        "waiting": JobFactory(team=team, name="waiting"),
    }


def _names(html: str) -> set[str]:
    rows = html[html.index("<tbody>") : html.index("</tbody>")]
    return {name for name in ("good", "broken", "stopped", "waiting") if f">{name}</a>" in rows}


def test_the_jobs_page_lists_the_jobs_that_ended_one_way(member_client, ended):
    page = member_client.get("/jobs/", {"ended": "failed"}).content.decode()
    assert _names(page) == {"broken"}
    assert '<option value="failed" selected>failed</option>' in page
    assert _names(member_client.get("/jobs/", {"ended": "cancelled"}).content.decode()) == {"stopped"}
    unknown = member_client.get("/jobs/", {"ended": "exploded"})  # the filters ignored, and the page says so
    assert unknown.status_code == 200 and _names(unknown.content.decode()) == set(ended)


def test_the_api_and_the_cli_list_the_same(client, member_token, monkeypatch, ended):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {member_token}"}
    items = client.get("/api/v1/jobs", {"ended": "failed"}, **auth).json()["items"]
    assert [job["name"] for job in items] == ["broken"]
    assert client.get("/api/v1/jobs", {"ended": "exploded"}, **auth).status_code == 422
    code, out, err = e31(monkeypatch, member_token, "ls", "--ended", "failed")
    assert code == 0, err
    assert [line.split()[1] for line in out.splitlines()[1:]] == ["broken"]
