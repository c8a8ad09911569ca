"""Arrays: one declaration, many tasks (each a job with its index), at most N running at once, listed as one
row that expands, cancelled all together or one by one."""

import pytest
from django.utils import timezone

from jobs import agent, declaration, rental, scheduler, services
from jobs.models import Job, JobArray
from tests.factories import JobFactory
from tests.jobs.intake_channels import error_fields, submit_api, submit_file

pytestmark = pytest.mark.django_db


@pytest.fixture
def raw(roots):
    _, out_root = roots
    return {
        "name": "sweep",
        "work": {"argv": ["python3", "sweep.py"]},
        "request": {"gpus": 1, "hours": 1.0},
        "output": {"uri": f"file://{out_root}/sweep", "bytes": 100},
    }


def _limits(**overrides):
    return declaration.Limits(pool_gpus=8, max_hours=24, data_roots=[], output_roots=[], **overrides)


@pytest.mark.parametrize(
    ("text", "indices", "limit"),
    [
        ("0-99%8", list(range(100)), 8),
        ("1,3,5-7", [1, 3, 5, 6, 7], None),
        (" 4 ", [4], None),
        ("0-3%10", [0, 1, 2, 3], None),  # a limit past the size limits nothing
    ],
)
def test_array_syntax(text, indices, limit):
    array = declaration._array(text, _limits(), declaration._Collector())
    assert list(array.indices) == indices and array.limit == limit


@pytest.mark.parametrize(
    "text", ["x", "5-2", "0-99%0", "1;2", "-3", "%4", "0-1001", "1,2,,-", "0-99999999999"]
)
def test_malformed_or_oversized_arrays_are_refused(text):
    errs = declaration._Collector()
    assert declaration._array(text, _limits(max_array=1000), errs) is None
    assert [path for path, _ in errs.errors] == ["array"]


def test_a_command_and_environment_past_their_bound_are_refused(client, member_token, pool, raw):
    """Each of 256 arguments could be 4,096 characters and each of 128 variables too: a 1 MB body was stored
    whole, and copied into every task of an array (100 tasks: 106 MB of rows, 8.7 s, 400 MB in the worker)."""
    raw["work"]["argv"] = ["python3", *["x" * 4000] * 20]
    response = submit_api(client, raw, member_token)
    assert response.status_code == 422 and error_fields(response) == {"work"}
    assert "64 KB" in response.content.decode()
    assert not Job.objects.exists()


def test_an_arrays_tasks_share_a_bound_on_what_each_copies(client, member_token, pool, raw):
    raw["work"]["argv"] = ["python3", "sweep.py", *["x" * 4000] * 3]  # 12 KB, within the bound of one job
    response = submit_api(client, {**raw, "array": "0-999"}, member_token)
    assert response.status_code == 422 and error_fields(response) == {"array"}
    assert "E31_ARRAY_INDEX" in response.content.decode()
    assert not Job.objects.exists()
    assert submit_api(client, {**raw, "array": "0-99"}, member_token).status_code == 201


def _inputs(count: int, uri_chars: int) -> list[dict]:
    return [
        {"name": f"in{i}", "uri": f"https://data.example.com/{i:02d}/" + "x" * uri_chars, "bytes": 1}
        for i in range(count)
    ]


def test_an_arrays_tasks_share_a_bound_on_the_inputs_each_copies(client, member_token, pool, raw):
    """Each task stores its own copy of the job's inputs: 1,000 tasks of 64 inputs with 2,000-character addresses,
    a 130 KB request, stored 64,000 rows and 146 MB, and cancelling the array let the same token do it again."""
    raw["data"] = _inputs(64, 1960)
    response = submit_api(client, {**raw, "array": "0-99"}, member_token)  # 6,400 inputs, 12.8 MB of copies
    assert response.status_code == 422 and error_fields(response) == {"array"}, response.content
    assert "inputs' addresses" in response.content.decode()
    assert not Job.objects.exists()
    assert submit_api(client, {**raw, "array": "0-9"}, member_token).status_code == 201


def test_an_arrays_tasks_share_a_bound_on_how_many_inputs_they_hold(client, member_token, pool, raw):
    raw["data"] = _inputs(64, 4)
    response = submit_api(client, {**raw, "array": "0-999"}, member_token)
    assert response.status_code == 422 and error_fields(response) == {"array"}, response.content
    assert "64,000 inputs" in response.content.decode()
    assert not Job.objects.exists()
    assert submit_api(client, {**raw, "array": "0-99"}, member_token).status_code == 201


def test_the_size_cap_is_e31_max_array(client, member_token, pool, raw, settings):
    settings.E31_MAX_ARRAY = 10
    response = submit_api(client, {**raw, "array": "0-10"}, member_token)
    assert response.status_code == 422 and error_fields(response) == {"array"}
    assert "at most 10 tasks" in response.json()["errors"][0]["message"]


def test_an_array_through_the_api_is_one_job_per_index_sharing_the_declaration(
    client, member_token, pool, raw, team
):
    response = submit_api(client, {**raw, "array": "0-4%2"}, member_token)
    assert response.status_code == 201, response.content
    body = response.json()
    array = JobArray.objects.get()
    assert body["array"] == {
        "id": array.id,
        "index": 0,
        "size": 5,
        "max_running": 2,
        "spec": "0-4%2",
        "limit_of": None,
    }
    tasks = list(Job.objects.filter(array=array).order_by("array_index"))
    assert [t.array_index for t in tasks] == [0, 1, 2, 3, 4] and tasks[0].id == body["id"]
    assert {(t.team_id, t.name, tuple(t.argv), t.gpus) for t in tasks} == {
        (team.id, "sweep", ("python3", "sweep.py"), 1)
    }
    listed = client.get(f"/api/v1/jobs?array={array.id}", HTTP_AUTHORIZATION=f"Bearer {member_token}").json()[
        "items"
    ]
    assert sorted(j["array"]["index"] for j in listed) == [0, 1, 2, 3, 4]


def test_a_job_file_declares_an_array(member_client, pool, raw):
    response = submit_file(member_client, {**raw, "array": "1,3"})
    assert response.status_code == 302, response.content
    assert sorted(Job.objects.values_list("array_index", flat=True)) == [1, 3]


def test_at_most_the_limit_runs_at_once_on_an_idle_pool_the_rest_wait_with_a_reason(team, member, pool, raw):
    spec = declaration.validate({**raw, "array": "0-5%2"}, limits=services.pool_limits(team=team))
    first = services.submit_job(team=team, user=member, spec=spec, now=timezone.now())
    Job.objects.filter(array_id=first.array_id).update(state="queued")
    scheduler.run_pass(now=timezone.now())
    states = dict(Job.objects.filter(array_id=first.array_id).values_list("array_index", "state"))
    assert states == {0: "rented", 1: "rented", 2: "queued", 3: "queued", 4: "queued", 5: "queued"}
    waiting = Job.objects.get(array_id=first.array_id, array_index=2)
    assert waiting.pending_reason == f"array {first.array_id} runs at most 2 tasks at once: 2 are running"
    assert waiting.estimated_start is not None


def test_each_task_sees_its_own_index():
    job = JobFactory()
    assert agent._array_env(job) == {}
    task = JobFactory(
        array=JobArray.objects.create(
            team=job.team, name="s", spec="0-9", size=10, first_index=0, submitted_at=timezone.now()
        ),
        array_index=7,
    )
    assert agent._array_env(task) == {"E31_ARRAY_ID": str(task.array_id), "E31_ARRAY_INDEX": "7"}


def _array_of(client, token, raw, text="0-3"):
    response = submit_api(client, {**raw, "array": text}, token)
    assert response.status_code == 201, response.content
    return response.json()["array"]["id"]


def test_cancel_one_task_or_every_live_task_of_the_array(client, member_token, pool, raw):
    array_id = _array_of(client, member_token, raw)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {member_token}"}
    one = Job.objects.get(array_id=array_id, array_index=1)
    assert client.post(f"/api/v1/jobs/{one.id}/cancel", **auth).status_code == 200
    assert Job.objects.filter(array_id=array_id, state="ended").count() == 1
    response = client.post(f"/api/v1/arrays/{array_id}/cancel", **auth)
    assert response.status_code == 200, response.content
    assert response.json()["states"] == {"ended": 4}
    assert set(Job.objects.filter(array_id=array_id).values_list("end_reason", flat=True)) == {"cancelled"}
    assert client.post(f"/api/v1/arrays/{array_id}/cancel", **auth).status_code == 409


def test_cancel_of_an_array_whose_tasks_are_still_stopping_answers_as_the_first_did(
    client, member_token, pool, raw
):
    """`e31 cancel --array A` sent again while its running tasks' agents stopped them said "has no live task:
    nothing to cancel" (409, exit 5): false, and a retried cancel read as a failed one."""
    array_id = _array_of(client, member_token, raw)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {member_token}"}
    Job.objects.filter(array_id=array_id).update(state="running", cancel_requested_at=timezone.now())
    response = client.post(f"/api/v1/arrays/{array_id}/cancel", **auth)
    assert response.status_code == 200, response.content
    assert response.json()["states"] == {"running": 4}


def test_another_team_neither_sees_nor_cancels_an_array(client, member_token, outsider, pool, raw):
    from accounts import services as accounts

    array_id = _array_of(client, member_token, raw)
    _, token = accounts.create_api_token(user=outsider, label="t")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    assert client.get(f"/api/v1/arrays/{array_id}", **auth).status_code == 404
    assert client.post(f"/api/v1/arrays/{array_id}/cancel", **auth).status_code == 404
    assert client.get(f"/api/v1/jobs?array={array_id}", **auth).json()["items"] == []
    assert not Job.objects.filter(array_id=array_id, state="ended").exists()


def test_the_job_list_shows_an_array_as_one_row_that_expands_to_its_tasks(
    member_client, client, member_token, pool, raw
):
    array_id = _array_of(client, member_token, raw, "0-29%4")
    single = submit_api(client, {**raw, "name": "single"}, member_token).json()["id"]
    page = member_client.get("/jobs/").content.decode()
    rows = page[page.index("<tbody>") : page.index("</tbody>")]
    assert (
        rows.count("<tr") == 2
        and f"array {array_id}" in rows
        and "30 tasks" in rows
        and f"/jobs/{single}/" in rows
    )
    assert f"?array={array_id}" in rows  # the expansion (and its link without JavaScript)
    expanded = member_client.get(f"/jobs/?array={array_id}").content.decode()
    tbody = expanded[expanded.index("<tbody>") : expanded.index("</tbody>")]
    assert tbody.count("<tr") == 25 and "single" not in tbody  # a page of its tasks


def test_an_arrays_row_says_how_its_tasks_ended_not_its_first_tasks_outcome(
    member_client, client, member_token, pool, raw
):
    """A six-task array: tasks 0 and 1 succeed, then its team cancels the rest. The jobs list's one row for it
    wore task 0's green "succeeded" badge, and said "2 released, 4 ended"."""
    array_id = _array_of(client, member_token, raw, "0-5")
    tasks = list(Job.objects.filter(array_id=array_id).order_by("array_index"))
    Job.objects.filter(id__in=[t.id for t in tasks[:2]]).update(state="released", end_reason="succeeded")
    assert member_client.post(f"/jobs/arrays/{array_id}/cancel/").status_code == 302
    page = member_client.get("/jobs/").content.decode()
    row = page[page.index("<tbody>") : page.index("</tbody>")]
    assert "6 tasks: 2 succeeded, 4 cancelled" in row
    assert '<span class="badge muted">4 of 6 cancelled</span>' in row and ">succeeded</span>" not in row
    head = member_client.get(f"/jobs/?array={array_id}").content.decode()
    assert "2 succeeded, 4 cancelled" in head[head.index(f'id="array-{array_id}-head"') :]
    tasks_rows = head[head.index("<tbody>") : head.index("</tbody>")]
    assert tasks_rows.count(">succeeded</span>") == 2  # each task's own row keeps its own outcome


def test_the_array_page_cancels_every_task(member_client, client, member_token, pool, raw):
    array_id = _array_of(client, member_token, raw)
    response = member_client.post(f"/jobs/arrays/{array_id}/cancel/")
    assert response.status_code == 302
    assert set(Job.objects.filter(array_id=array_id).values_list("state", flat=True)) == {"ended"}


def test_an_array_is_held_to_an_enforced_budget_as_a_whole(team, member, operator, pool, raw):
    from decimal import Decimal

    from metering import services as metering

    metering.set_budget(
        team_id=team.id, gpu_hours=Decimal(10), enforced=True, operator=operator, now=timezone.now()
    )
    team.refresh_from_db()
    within = declaration.validate({**raw, "array": "0-9"}, limits=services.pool_limits(team=team))
    assert services.submit_job(team=team, user=member, spec=within, now=timezone.now()).array.size == 10
    past = declaration.validate({**raw, "array": "0-10"}, limits=services.pool_limits(team=team))
    with pytest.raises(declaration.DeclarationInvalid):  # 11 tasks of one GPU-hour each, on top of the 10
        services.submit_job(team=team, user=member, spec=past, now=timezone.now())
    assert Job.objects.count() == 10


def test_the_forms_budget_preview_weighs_every_task_of_an_array(team, member_client, pool, roots):
    """Team vision has an enforced budget of 50 GPU-hours a month. A member fills the form with 1 GPU x 1 h
    and Array "0-99": the preview weighs the 100 tasks, as submitting does, and says the job would be
    refused; submitting is then refused."""
    team.monthly_budget_gpu_hours = 50
    team.budget_enforced = True
    team.save()
    _, out = roots
    draft = {
        "name": "sweep", "work.argv": "python3\nsweep.py", "request.gpus": "1", "request.hours": "1",
        "output.uri": f"file://{out}/sweep", "output.bytes": "10", "array": "0-99",
    }  # fmt: skip
    preview = member_client.post("/jobs/new/estimate/", draft, HTTP_HX_REQUEST="true")
    assert preview.status_code == 200
    html = preview.content.decode()
    assert "for 100 tasks" in html and "to 100 of 50 GPU-hours" in html and "refused" in html
    submitted = member_client.post("/jobs/new/", {**draft, "action": "submit"})
    assert submitted.status_code == 422 and not Job.objects.exists()


def test_the_ledger_statement_groups_an_arrays_tasks_into_one_line(team, member, pool, raw):
    from metering import periods, reports

    spec = declaration.validate({**raw, "array": "0-2"}, limits=services.pool_limits(team=team))
    first = services.submit_job(team=team, user=member, spec=spec, now=timezone.now())
    alone = services.submit_job(
        team=team,
        user=member,
        spec=declaration.validate(raw, limits=services.pool_limits(team=team)),
        now=timezone.now(),
    )
    Job.objects.update(state="queued")
    scheduler.run_pass(now=timezone.now())
    for job in Job.objects.all():
        rental.release_job(job_id=job.id, end_reason="succeeded", now=timezone.now(), actor="agent")
    lines = reports.statement(team=team, month=periods.month_start(timezone.now())).jobs
    assert sorted((line.array_id or 0, line.tasks) for line in lines) == [(0, 0), (first.array_id, 3)]
    grouped = next(line for line in lines if line.array_id)
    assert grouped.job_id == first.id and grouped.name == "sweep"
    assert next(line for line in lines if not line.array_id).job_id == alone.id


def test_the_form_submits_an_array_and_a_tasks_page_names_it(member_client, pool, raw):
    from tests.jobs.intake_channels import as_form_fields

    response = member_client.post("/jobs/new/", {**as_form_fields(raw), "array": "0-2%1"})
    assert response.status_code == 302, response.content
    task = Job.objects.get(array_index=1)
    page = member_client.get(f"/jobs/{task.id}/").content.decode()
    assert (
        f'task 1 of <a href="/jobs/?array={task.array_id}">array {task.array_id}</a> [0-2%1], 3 tasks' in page
    )


def test_a_state_filter_lists_each_task_in_that_state_even_when_the_first_task_is_not(
    member_client, client, member_token, pool, raw
):
    array_id = _array_of(client, member_token, raw, "0-2")
    Job.objects.filter(array_id=array_id, array_index=0).update(state="queued")
    page = member_client.get("/jobs/?state=submitted").content.decode()
    rows = page[page.index("<tbody>") : page.index("</tbody>")]
    assert rows.count("<tr") == 2 and rows.count("task ") == 2


def test_a_requeued_or_rerun_task_still_counts_against_its_arrays_limit(
    team, member, member_client, operator, pool, raw
):
    """An operator's requeue (or a team's re-run) of a task submits it as a one-task array of its own index:
    counted on its own, every failed task of a "%2" array requeued at once would run together."""
    from operations import services as operations

    now = timezone.now()
    spec = declaration.validate({**raw, "array": "0-5%2"}, limits=services.pool_limits(team=team))
    first = services.submit_job(team=team, user=member, spec=spec, now=now)
    tasks = dict(Job.objects.filter(array_id=first.array_id).values_list("array_index", "id"))
    for index in (0, 1, 2):
        operations.requeue_job(job_id=tasks[index], actor=operator, now=now)
    rerun = services.submit_job(
        team=team,
        user=member,
        spec=declaration.validate({**raw, "array": "3"}, limits=services.pool_limits(team=team)),
        now=now,
        rerun_of=Job.objects.get(id=tasks[3]),
    )
    Job.objects.filter(state__in=("submitted", "staging")).update(state="queued")
    scheduler.run_pass(now=timezone.now())
    assert Job.objects.filter(state="rented").count() == 2
    waiting = Job.objects.get(id=rerun.id)
    assert waiting.state == "queued"
    assert waiting.pending_reason == f"array {first.array_id} runs at most 2 tasks at once: 2 are running"
    assert waiting.array_index == 3 and waiting.array.limit_of_id == first.array_id
    page = member_client.get(f"/jobs/{rerun.id}/").content.decode()
    assert f'run again from <a href="/jobs/?array={first.array_id}">array {first.array_id}</a>' in page
    assert "counted among its at most 2 running at once" in page


def test_an_arrays_list_and_cancel_take_in_its_tasks_run_again_on_their_own(
    client, member_token, operator, pool, raw
):
    from operations import services as operations

    array_id = _array_of(client, member_token, raw, "0-2%1")
    failed = Job.objects.get(array_id=array_id, array_index=2)
    copy = operations.requeue_job(job_id=failed.id, actor=operator, now=timezone.now())
    auth = {"HTTP_AUTHORIZATION": f"Bearer {member_token}"}
    listed = client.get(f"/api/v1/jobs?array={array_id}", **auth).json()["items"]
    assert copy.id in {j["id"] for j in listed}
    assert client.post(f"/api/v1/arrays/{array_id}/cancel", **auth).status_code == 200
    copy.refresh_from_db()
    assert copy.state == "ended" and copy.end_reason == "cancelled"
