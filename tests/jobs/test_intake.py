"""Every rule of the job declaration, through the form, the job file and the API alike."""

import copy
import os
import time

import pytest
from django.urls import reverse

from jobs import declaration
from jobs.models import DataInput, Job
from tests.factories import NodeFactory
from tests.jobs.formparse import form_fields
from tests.jobs.intake_channels import as_form_fields, error_fields, submit_api, submit_file, submit_form

pytestmark = pytest.mark.django_db


@pytest.fixture
def good(roots):
    data_root, out_root = roots
    (data_root / "corpus.bin").write_bytes(b"x" * 64)
    return {
        "name": "retrain-q3",
        "work": {"argv": ["python3", "train.py", "--epochs=3"], "env": {"SEED": "7"}},
        "data": [{"name": "corpus", "uri": f"file://{data_root}/corpus.bin", "bytes": 64}],
        "request": {"gpus": 2, "hours": 1.5},
        "output": {"uri": f"file://{out_root}/retrain", "bytes": 1000},
    }


def _with(raw: dict, path: str, value) -> dict:
    """A copy of the declaration with one field replaced (or removed when value is ...)."""
    out = copy.deepcopy(raw)
    *parents, leaf = path.split(".")
    target = out
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    if value is ...:
        del target[leaf if not leaf.isdigit() else int(leaf)]
    else:
        target[int(leaf) if leaf.isdigit() else leaf] = value
    return out


def _bad_cases(data_root, out_root, outside):
    return {
        "argv empty": ("work.argv", [], "work.argv"),
        "argv as a shell string": ("work.argv", "python train.py && rm -rf /", "work.argv"),
        "reserved env E31_": ("work.env", {"E31_JOB_ID": "1"}, "work.env.E31_JOB_ID"),
        "reserved env CUDA": ("work.env", {"CUDA_VISIBLE_DEVICES": "0"}, "work.env.CUDA_VISIBLE_DEVICES"),
        "invalid env name": ("work.env", {"1BAD": "x"}, "work.env.1BAD"),
        "a secret the team does not hold": ("work.secrets", ["WANDB_API_KEY"], "work.secrets[0]"),
        "a reserved name as a secret": ("work.secrets", ["E31_JOB_ID"], "work.secrets[0]"),
        "a secret also declared in env": ("work.secrets", ["SEED"], "work.secrets[0]"),
        "duplicate input names": ("data", [
            {"name": "a", "uri": f"file://{data_root}/corpus.bin", "bytes": 64},
            {"name": "a", "uri": f"file://{data_root}/corpus.bin", "bytes": 64}], "data[1].name"),
        "unknown scheme": ("data.0.uri", "ftp://example.com/x", "data[0].uri"),
        "etc passwd": ("data.0.uri", "file:///etc/passwd", "data[0].uri"),
        "dot-dot out of the root": ("data.0.uri", f"file://{data_root}/../../../etc/passwd", "data[0].uri"),
        "symlink out of the root": ("data.0.uri", f"file://{data_root}/escape", "data[0].uri"),
        "negative size": ("data.0.bytes", -5, "data[0].bytes"),
        "absurd size": ("data.0.bytes", "900 EB", "data[0].bytes"),
        "bad sha256": ("data.0.sha256", "abc", "data[0].sha256"),
        "zero gpus": ("request.gpus", 0, "request.gpus"),
        "more gpus than the pool": ("request.gpus", 999, "request.gpus"),
        "zero hours": ("request.hours", 0, "request.hours"),
        "a vanishing time limit": ("request.hours", 1e-300, "request.hours"),
        "gpus as a boolean": ("request.gpus", True, "request.gpus"),
        "hours as a boolean": ("request.hours", True, "request.hours"),
        "min_gpus as a boolean": ("request.min_gpus", True, "request.min_gpus"),
        "input size as a boolean": ("data.0.bytes", True, "data[0].bytes"),
        "output size as a boolean": ("output.bytes", True, "output.bytes"),
        "absurd gpus": ("request.gpus", 10**30, "request.gpus"),
        "absurd output size": ("output.bytes", 10**30, "output.bytes"),
        "too many hours": ("request.hours", 10_000, "request.hours"),
        "min_gpus above gpus": ("request.min_gpus", 5, "request.min_gpus"),
        "output outside its roots": ("output.uri", f"file://{outside}/out", "output.uri"),
        "output over http": ("output.uri", "https://example.com/up", "output.uri"),
        "missing request part": ("request", ..., "request"),
        "missing name": ("name", "", "name"),
        "image without a registry": ("work.image", "busybox:latest", "work.image"),
        "image with a shell in it": ("work.image", "reg.example/a:b;rm -rf /", "work.image"),
        "image with a short digest": ("work.image", "reg.example/a@sha256:abc", "work.image"),
        "image with an upper-case name": ("work.image", "reg.example/Team/App:1", "work.image"),
        "control characters in name": ("name", "bad\x07name", "name"),
        # What the rules took and the database or the stager then failed on (a server error, a job stuck staging).
        "a bracketed host left open": ("data.0.uri", "https://[::1/x", "data[0].uri"),
        "a bracketed host that is no address": ("data.0.uri", "https://[notip]/x", "data[0].uri"),
        "a bracketed bucket left open": ("data.0.uri", "s3://[bucket/x", "data[0].uri"),
        "a destination's bracketed bucket left open": ("output.uri", "s3://[bucket/out/", "output.uri"),
        "a port past 65535": ("data.0.uri", "https://example.com:99999/x", "data[0].uri"),
        "a port that is no number": ("data.0.uri", "https://example.com:abc/x", "data[0].uri"),
        "a host label over 63 characters": ("data.0.uri", f"http://{'a' * 64}.example.com/x", "data[0].uri"),
        "an empty host label": ("data.0.uri", "https://data..example.com/x", "data[0].uri"),
        "a registry label over 63 characters": ("work.image", f"{'r' * 64}.example.com/a:1", "work.image"),
        "an encoded NUL in a file input": ("data.0.uri", f"file://{data_root}/corpus%00.bin", "data[0].uri"),
        "an encoded NUL in a file destination": ("output.uri", f"file://{out_root}/x%00y/", "output.uri"),
        "a password in a data URI": ("data.0.uri", "https://alice:hunter2@example.com/w.bin", "data[0].uri"),
        "a workdir wider than its column": ("work.workdir", "a" * 201, "work.workdir"),
        "control characters in workdir": ("work.workdir", "run\n\x1b[31m\ttab", "work.workdir"),
        "an image its default tag takes past 200 characters": (
            "work.image", "registry.example.com/" + "a" * 179, "work.image"),
        "a sha256 with a trailing newline": ("data.0.sha256", "a" * 64 + "\n", "data[0].sha256"),
    }  # fmt: skip


CASES = list(_bad_cases("D", "O", "X"))


@pytest.mark.parametrize("channel", ["form", "file", "api"])
@pytest.mark.parametrize("case", CASES)
def test_every_rule_is_refused_naming_the_field_and_nothing_is_written(
    case, channel, good, roots, pool, member_client, member_token, tmp_path
):
    data_root, out_root = roots
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    os.symlink("/etc/passwd", data_root / "escape")
    path, value, field = _bad_cases(data_root, out_root, outside)[case]
    raw = _with(good, path, value)
    if channel == "form" and case == "missing request part":
        raw = _with(good, "request", {})
        field = "request.gpus"
    response = {
        "form": lambda: submit_form(member_client, raw),
        "file": lambda: submit_file(member_client, raw),
        "api": lambda: submit_api(member_client, raw, member_token),
    }[channel]()
    assert response.status_code == 422, response.content[:500]
    assert field in error_fields(response) or any(f.startswith(field) for f in error_fields(response))
    assert Job.objects.count() == 0 and DataInput.objects.count() == 0


TYPOS = {
    "request.memroy": ("8 GB", "not a field of the request part: did you mean memory?"),
    "request.preemptable": (True, "not a field of the request part: did you mean preemptible?"),
    "work.enviroment": (
        {"SEED": "7"},
        "not a field of the work part: one of argv, env, image, secrets, workdir",
    ),
    "data.0.sha": ("a" * 64, "not a field of the data part: did you mean sha256?"),
    "after": ([1], "not a field of a job: did you mean after_ok?"),
}


@pytest.mark.parametrize("channel", ["file", "api"])
@pytest.mark.parametrize("typo", TYPOS)
def test_a_field_no_part_has_is_refused_by_name_not_dropped(
    typo, channel, good, pool, member_client, member_token
):
    value, message = TYPOS[typo]
    raw = _with(good, typo, value)
    submit = submit_file if channel == "file" else lambda client, raw: submit_api(client, raw, member_token)
    response = submit(member_client, raw)
    assert response.status_code == 422
    field = typo.replace(".0.", "[0].")
    if channel == "api":
        assert {"field": field, "message": message} in response.json()["errors"]
    else:
        assert response.context["form"].errors[field] == message
    assert Job.objects.count() == 0


@pytest.mark.parametrize("channel", ["form", "file", "api"])
def test_a_valid_declaration_is_stored_the_same_through_every_channel(
    channel, good, pool, member_client, member_token
):
    response = {
        "form": lambda: submit_form(member_client, good),
        "file": lambda: submit_file(member_client, good),
        "api": lambda: submit_api(member_client, good, member_token),
    }[channel]()
    assert response.status_code in (201, 302), response.content[:500]
    job = Job.objects.get()
    assert job.argv == ["python3", "train.py", "--epochs=3"]
    assert job.env == {"SEED": "7"}
    assert (job.gpus, job.hours, job.output_bytes) == (2, 1.5, 1000)
    assert list(job.inputs.values_list("name", "bytes")) == [("corpus", 64)]
    assert job.events.get().to_state == "submitted"


def test_a_password_in_a_data_uri_is_refused_and_never_echoed_back(good, pool, member_client, member_token):
    raw = _with(good, "data.0.uri", "https://alice:hunter2-token@example.com/w.bin")
    response = submit_api(member_client, raw, member_token)
    assert response.status_code == 422 and "data[0].uri" in error_fields(response)
    assert "hunter2-token" not in response.content.decode()
    assert "team secret" in response.json()["errors"][0]["message"]


def test_the_form_refuses_more_than_64_inputs_instead_of_dropping_the_rest(good, roots, pool, member_client):
    data_root, _ = roots
    inputs = []
    for i in range(70):
        (data_root / f"f{i}.bin").write_bytes(b"x")
        inputs.append({"name": f"in{i}", "uri": f"file://{data_root}/f{i}.bin", "bytes": 1})
    response = submit_form(member_client, _with(good, "data", inputs))
    assert response.status_code == 422
    assert response.context["form"].errors["data"] == "at most 64 inputs"
    assert Job.objects.count() == 0 and DataInput.objects.count() == 0


def test_the_form_refuses_a_variable_set_twice_instead_of_keeping_the_last(good, pool, member_client):
    fields = {**as_form_fields(good), "work.env": "SEED=7\nSEED=8"}
    response = member_client.post(reverse("jobs:new"), fields)
    assert response.status_code == 422
    assert "SEED is set twice" in response.context["form"].errors["work.env"]
    assert Job.objects.count() == 0


@pytest.mark.parametrize("field", ["after_ok", "after_any"])
def test_the_form_refuses_a_job_id_too_long_for_a_number_as_no_job_id(good, pool, member_client, field):
    response = member_client.post(reverse("jobs:new"), {**as_form_fields(good), field: "9" * 5000})
    assert response.status_code == 422
    assert response.context["form"].errors == {f"{field}[0]": "a job id (a whole number)"}
    assert Job.objects.count() == 0


def test_the_form_accepts_sizes_with_units(good, pool, member_client, settings):
    settings.E31_STAGE_CACHE_BYTES = 4 * 10**12  # a staging cache whose team share holds it
    remote = _with(
        good, "data.0.uri", "https://data.example.com/corpus.bin"
    )  # a local file is checked for size
    raw = _with(remote, "data.0.bytes", "1.5 TB")
    response = submit_form(member_client, raw)
    assert response.status_code == 302
    assert DataInput.objects.get().bytes == 1_500_000_000_000


def test_unicode_names_are_kept(good, pool, member_client, member_token):
    raw = _with(good, "name", "résumé-训练-🚀")
    assert submit_api(member_client, raw, member_token).status_code == 201
    assert Job.objects.get().name == "résumé-训练-🚀"


def test_malformed_json_is_a_400_naming_the_problem(member_client, member_token):
    response = member_client.post(
        "/api/v1/jobs",
        data="{not json",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {member_token}",
    )
    assert response.status_code == 400
    assert "parse" in response.json()["detail"].lower()


def test_a_job_file_that_is_not_toml_is_a_400(member_client):
    response = member_client.post(
        reverse("jobs:new"), {"action": "load-file", "job_file": "name = [unclosed"}
    )
    assert response.status_code == 400
    assert "not valid TOML" in response.context["form"].errors["file"]
    assert Job.objects.count() == 0


def test_a_ten_megabyte_paste_is_refused_cleanly(member_client):
    response = member_client.post(
        reverse("jobs:new"), {"action": "load-file", "job_file": "x" * (10 * 1024 * 1024)}
    )
    assert response.status_code == 400
    assert Job.objects.count() == 0


def _deep_job_file(depth: int) -> str:
    return "a = " + "[" * depth + "]" * depth + "\n"


@pytest.mark.parametrize("action", ["load-file", "submit-file"])
def test_a_deeply_nested_job_file_is_a_400_naming_the_problem(member_client, action):
    """Reproduction 9: a 4 KB job file ``a = [[[…1500 deep…]]]`` answered 500 (RecursionError)."""
    text = _deep_job_file(1500)
    assert len(text) < 4096
    response = member_client.post(reverse("jobs:new"), {"action": action, "job_file": text})
    assert response.status_code == 400
    assert "nested" in response.context["form"].errors["file"]
    assert Job.objects.count() == 0


def test_a_deeply_nested_api_body_is_a_400(member_client, member_token):
    body = '{"name": ' + "[" * 5000 + "]" * 5000 + "}"
    response = member_client.post(
        "/api/v1/jobs",
        data=body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {member_token}",
    )
    assert response.status_code == 400
    assert "nested" in response.json()["detail"]


def test_loading_a_job_file_fills_the_form_without_submitting(good, pool, member_client):
    import tomli_w

    response = member_client.post(
        reverse("jobs:new"), {"action": "load-file", "job_file": tomli_w.dumps(good)}
    )
    assert response.status_code == 200
    form = response.context["form"]
    assert form.values["name"] == "retrain-q3"
    assert form.values["work.argv"] == "python3\ntrain.py\n--epochs=3"
    assert form.rows[0]["uri"].endswith("corpus.bin")
    assert Job.objects.count() == 0


def test_loading_a_job_file_with_a_mistyped_key_says_so_instead_of_dropping_it(good, pool, member_client):
    """A member loads a job file asking ``gpu = 2`` (for ``gpus``) into the form: "Job file loaded", the form said
    1 GPU, and submitting ran the job on 1 GPU, while the same file submitted as it is, the CLI and the API all
    refuse it with "did you mean gpus?"."""
    import tomli_w

    good["request"]["gpu"] = 2
    good["data"][0]["sha"] = "0" * 64
    text = tomli_w.dumps(good)
    response = member_client.post(reverse("jobs:new"), {"action": "load-file", "job_file": text})
    assert response.status_code == 400
    form = response.context["form"]
    assert form.errors["request.gpu"] == "not a field of the request part: did you mean gpus?"
    assert "did you mean sha256?" in form.errors["data[0].sha"]
    assert form.values["name"] == "retrain-q3"  # what it knows is filled in, to fix beside the file
    assert response.context["job_file"] == text
    html = response.content.decode()
    assert "Job file loaded" not in html and "did you mean gpus?" in html  # in the form's list of problems


def test_inputs_are_added_and_removed_in_place(member_client):
    response = member_client.post(
        reverse("jobs:new"), {"action": "add-input", "data[0].name": "a"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<form id="job-form"')  # only the fragment, swapped in place
    assert 'id="data-row-1"' in html and 'id="data-row-2"' not in html
    response = member_client.post(
        reverse("jobs:new"), {"action": "remove-input-0", "data[0].name": "a", "data[1].name": "b"}
    )
    assert [r["name"] for r in response.context["form"].rows] == ["b"]


def test_remove_takes_out_the_row_whose_button_was_pressed_even_after_a_blank_row(member_client):
    """A member has three input rows, has cleared the first, and presses Remove on the second ("corpus"):
    "corpus" goes; the blank first row and "labels" stay where they were."""
    rows = {
        f"data[{i}].{part}": value
        for i, name in enumerate(("", "corpus", "labels"))
        for part, value in (("name", name), ("uri", f"file:///x/{name}.tar" if name else ""))
    }
    answer = member_client.post(
        reverse("jobs:new"), {**rows, "action": "remove-input-1"}, HTTP_HX_REQUEST="true"
    )
    assert answer.status_code == 200
    shown = form_fields(answer.content.decode())
    assert [shown[f"data[{i}].name"] for i in (0, 1)] == ["", "labels"] and "data[2].name" not in shown


def test_add_an_input_adds_a_row_to_a_fresh_form_each_time_it_is_pressed(member_client):
    """A member opens "Submit a job" (one empty input row) and presses "+ Add an input" twice before typing
    anything: each press adds a row."""
    fields = form_fields(member_client.get(reverse("jobs:new")).content.decode())
    for rows in (2, 3):
        answer = member_client.post(
            reverse("jobs:new"), {**fields, "action": "add-input"}, HTTP_HX_REQUEST="true"
        )
        fields = form_fields(answer.content.decode())
        assert sum(name.endswith("].uri") for name in fields) == rows


def test_blank_input_rows_are_no_inputs_and_errors_land_on_the_row_shown(good, pool, member_client):
    """A member submits with a blank first row above a row whose URI the rules refuse: the job has no
    blank input, and the error stands beside the refused row as the form then shows it."""
    fields = {**as_form_fields(good), "data[0].uri": "", "data[0].name": "", "data[0].bytes": ""}
    fields |= {"data[1].name": "bad", "data[1].uri": "ftp://x/y", "data[1].bytes": "10", "action": "submit"}
    answer = member_client.post(reverse("jobs:new"), fields)
    assert answer.status_code == 422
    form = answer.context["form"]
    assert [row["name"] for row in form.rows] == ["bad"] and "data[0].uri" in form.errors


@pytest.mark.parametrize(
    ("typed", "argv"),
    [
        ("python3\ntrain.py\n\n", ["python3", "train.py"]),  # trailing blank lines are no arguments
        ("python3\n\nx", ["python3", "", "x"]),
        ('["sh", "-c", "set -e\\npython train.py"]', ["sh", "-c", "set -e\npython train.py"]),
        ("[\n-f\nx\n]", ["[", "-f", "x", "]"]),  # not JSON: the test program, one argument a line
    ],
)
def test_the_command_box_takes_one_argument_per_line_or_a_json_list(good, pool, member_client, typed, argv):
    """A member types the command one argument per line, or as a JSON list of strings: the job runs
    that argv."""
    response = member_client.post(reverse("jobs:new"), {**as_form_fields(good), "work.argv": typed})
    assert response.status_code == 302, error_fields(response)
    assert Job.objects.get().argv == argv


def test_a_job_file_whose_argv_lines_cannot_hold_loads_as_a_json_list_and_submits_the_same(
    good, pool, member_client
):
    """A member loads a job file whose argv has a script of two lines and an empty argument, then submits
    the form as it is shown: the job runs the file's argv."""
    import tomli_w

    argv = ["sh", "-c", "set -e\npython train.py", ""]
    raw = {**good, "work": {**good["work"], "argv": argv}}
    loaded = member_client.post(reverse("jobs:new"), {"action": "load-file", "job_file": tomli_w.dumps(raw)})
    fields = form_fields(loaded.content.decode())
    assert fields["work.argv"].startswith("[")
    response = member_client.post(reverse("jobs:new"), {**fields, "action": "submit"})
    assert response.status_code == 302, error_fields(response)
    assert Job.objects.get().argv == argv


def test_the_job_page_shows_the_declaration_and_its_events(good, pool, member_client):
    response = submit_form(member_client, good)
    page = member_client.get(response["Location"])
    html = page.content.decode()
    assert "python3 train.py --epochs=3" in html and "submitted" in html


def test_a_job_past_an_enforced_budget_is_refused_in_the_form_and_the_api(
    good, pool, team, member_client, member_token
):
    team.monthly_budget_gpu_hours = 2
    team.budget_enforced = True
    team.save()
    for response in (submit_form(member_client, good), submit_api(member_client, good, member_token)):
        assert response.status_code == 422
        assert "request.hours" in error_fields(response)
        assert "refused" in response.content.decode()
    assert Job.objects.count() == 0


def test_a_job_past_a_warning_budget_is_stored_with_a_note(good, pool, team, member_client, member_token):
    team.monthly_budget_gpu_hours = 2
    team.budget_enforced = False
    team.save()
    response = submit_api(member_client, good, member_token)
    assert response.status_code == 201
    assert "warning only" in response.json()["budget_note"]


def test_the_form_previews_the_estimated_start_and_the_budget(pool, member_client):
    response = member_client.post(
        reverse("jobs:estimate"), {"request.gpus": "2", "request.hours": "3"}, HTTP_HX_REQUEST="true"
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert "Estimated start if submitted now" in html and "Monthly GPU-hours" in html
    assert "with a 1.5 h limit" in html and "elastic, 1-2 GPUs" in html


@pytest.mark.parametrize("hours", ["inf", "nan"])  # 1e300 is named as over the maximum: test_submit_preview
def test_the_preview_asks_for_a_time_limit_when_the_hours_are_no_finite_limit(pool, member_client, hours):
    response = member_client.post(reverse("jobs:estimate"), {"request.gpus": "1", "request.hours": hours})
    assert response.status_code == 200
    assert "Enter GPUs and a time limit" in response.content.decode()


def test_the_preview_says_when_a_draft_is_larger_than_the_pool(pool, member_client):
    response = member_client.post(reverse("jobs:estimate"), {"request.gpus": "64", "request.hours": "1"})
    assert "GPUs: the pool can place at most 8 GPUs for one job" in response.content.decode()


def test_a_job_sent_before_any_node_is_up_is_told_so_not_that_the_pool_places_0_gpus(
    good, member_client, member_token
):
    response = submit_api(member_client, good, member_token)  # no `pool`: no node has registered
    assert response.status_code == 422
    messages = {e["field"]: e["message"] for e in response.json()["errors"]}
    assert messages["request.gpus"].startswith("no node is up yet"), messages


@pytest.mark.parametrize("channel", ["form", "file", "api"])
def test_a_job_naming_an_image_may_leave_argv_to_the_images_cmd(
    channel, good, pool, member_client, member_token
):
    raw = _with(_with(good, "work.argv", []), "work.image", "registry.example.com/team/trainer")
    response = {
        "form": lambda: submit_form(member_client, raw),
        "file": lambda: submit_file(member_client, raw),
        "api": lambda: submit_api(member_client, raw, member_token),
    }[channel]()
    assert response.status_code in (201, 302), response.content[:500]
    job = Job.objects.get()
    assert (job.argv, job.image) == ([], "registry.example.com/team/trainer:latest")


@pytest.mark.parametrize(
    ("models", "asked", "refused"),
    [
        (["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"], "H100", False),
        (
            ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"],
            "h100",
            False,
        ),  # a mixed pool: it runs on the H100s
        (["NVIDIA A100-SXM4-80GB"], "H100", True),
        (["NVIDIA A100-SXM4-80GB"], "A10", True),  # in the name's text, but not the model
    ],
)
def test_a_gpu_model_is_taken_while_a_node_has_it(good, member_client, member_token, models, asked, refused):
    """The scheduler places a job that names a model only on nodes of that model: one no node has is refused."""
    for i, model in enumerate(models):
        NodeFactory(name=f"m-{i}", gpu_model=model)
    response = submit_api(member_client, _with(good, "request.gpu_model", asked), member_token)
    if not refused:
        assert response.status_code == 201
        assert Job.objects.get().gpu_model == asked
        return
    assert response.status_code == 422
    (error,) = response.json()["errors"]
    assert error["field"] == "request.gpu_model"
    assert error["message"].startswith(f"no node of this pool has {asked} GPUs")
    assert ", ".join(sorted(set(models))) in error["message"]
    assert Job.objects.count() == 0


@pytest.mark.parametrize("flag", ["requeue", "preemptible"])
@pytest.mark.parametrize("value", [1, 0, 1.0])
def test_a_flag_that_is_a_number_is_refused_not_taken_for_false(flag, value, good, pool, member_client):
    """Reproduction: `requeue = 1` in a job file passed the check (1 == True) and was stored false: the job ended
    node_lost where its team asked for a requeue."""
    response = submit_file(member_client, _with(good, f"request.{flag}", value))
    assert response.status_code == 422
    assert response.context["form"].errors[f"request.{flag}"] == "true or false"
    assert Job.objects.count() == 0


def test_the_preview_is_limited_per_member_and_says_when_it_resumes(
    pool, member_client, outsider_client, settings, still_rate_clock
):
    """Each preview plans the queue up to four times: a member scripting it past E31_PREVIEW_RATE is told to
    wait (429 with Retry-After; the form's own htmx request gets the message in place), others are not slowed."""
    settings.E31_PREVIEW_RATE = "3/m"
    draft = {"request.gpus": "1", "request.hours": "1"}
    answers = [member_client.post(reverse("jobs:estimate"), draft) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert "Estimated start if submitted now" in answers[-1].content.decode()

    refused = member_client.post(reverse("jobs:estimate"), draft)
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert "Estimated start" not in refused.content.decode()
    in_place = member_client.post(reverse("jobs:estimate"), draft, HTTP_HX_REQUEST="true")
    assert in_place.status_code == 200  # htmx swaps only what it may: the fragment says why, in place
    assert "More than 3 previews a minute" in in_place.content.decode()

    other = outsider_client.post(reverse("jobs:estimate"), draft)
    assert other.status_code == 200


# A key of more segments than MAX_NESTING nests that deep once parsed, and is refused then; parsing it first took
# time and memory growing with the square of its length (tomllib keeps every prefix): 64 KB, 11.8 s and 3.9 GB.
# Sized so each took over a second to parse here (a key of 12,000 parts: 1.3 s; 60,000: most of a gigabyte).
DOTTED_KEYS = {
    "key": "a." * 12_000 + "a = 1\n",
    "header": "[" + "a." * 60_000 + "a]\nb = 1\n",
    "inline table": "x = {" + "a." * 60_000 + "a = 1}\n",
    "quoted parts": '"a".' * 12_000 + '"a" = 1\n',
}


@pytest.mark.parametrize("form", DOTTED_KEYS)
def test_a_job_file_of_long_dotted_keys_is_refused_before_it_is_parsed(member_client, member_token, form):
    text = DOTTED_KEYS[form]
    assert len(text) <= 256 * 1024
    started = time.monotonic()
    api = member_client.post(
        "/api/v1/jobs/file",
        data=text,
        content_type="application/toml",
        HTTP_AUTHORIZATION=f"Bearer {member_token}",
    )
    page = member_client.post(reverse("jobs:new"), {"action": "load-file", "job_file": text})
    assert time.monotonic() - started < 1.0
    assert api.status_code == 422 and "nested" in api.json()["errors"][0]["message"]
    assert page.status_code == 400 and "nested" in page.context["form"].errors["file"]
    assert Job.objects.count() == 0


def test_a_dotted_name_inside_a_string_or_comment_is_no_key(good, pool, member_client):
    """The check reads keys only: a Java class of a dozen parts in the command or a comment is a plain value."""
    name = ".".join(f"part{i}" for i in range(14))
    text = f"# runs {name}\nname = \"{name}\"\n[work]\nargv = [\"java\", \"{name}\", '''{name}''']\n"
    raw = declaration.parse_job_file(text)
    assert raw["name"] == name and raw["work"]["argv"][1:] == [name, name]


def test_a_multi_line_string_ending_in_quotes_neither_hides_a_deep_key_nor_refuses_a_good_file():
    """Found in review: TOML lets a multi-line string end in up to two quotes before its closing three; read as
    ending at the first three, the quote left over opened a string, hiding a key of 120,000 parts (a 19.9 s parse)
    and refusing a good file whose dotted value followed on its line."""
    for quotes in ('"""', "'''"):
        hidden = "x = {a = " + quotes + "q" + quotes[0] + quotes + ', b = "z", ' + "c." * 12_000 + "c = 1}\n"
        with pytest.raises(declaration.DeclarationInvalid, match="nested"):
            started = time.monotonic()
            declaration.parse_job_file(hidden)
        assert time.monotonic() - started < 0.5
    name = ".".join(f"part{i}" for i in range(14))
    good = f'name = "n"\n[work]\nargv = ["""echo "hi"""", \'\'\'it\'s\'\'\'\', "{name}"]\n'
    assert declaration.parse_job_file(good)["work"]["argv"] == ['echo "hi"', "it's'", name]


def test_a_job_file_saved_with_a_byte_order_mark_is_read_as_its_text(member_client, member_token):
    """Reproduction: a file a Windows editor saved as "UTF-8 with BOM" was refused as "not valid TOML: Invalid
    statement (at line 1, column 1)", naming nothing the user could see in the file."""
    raw = declaration.parse_job_file('\ufeffname = "bom"\n[work]\nargv = ["true"]\n')
    assert raw["name"] == "bom"
    api = member_client.post(
        "/api/v1/jobs/file",
        data=b'\xef\xbb\xbfname = "bom"\n',
        content_type="application/toml",
        HTTP_AUTHORIZATION=f"Bearer {member_token}",
    )
    assert api.status_code == 422 and all("TOML" not in e["message"] for e in api.json()["errors"])


def test_a_job_file_in_another_encoding_is_an_invalid_job_file_a_422(member_client, member_token):
    """A UTF-16 file was a 400, which the CLI reads as an API error (exit 1), not an invalid job file (exit 6)."""
    api = member_client.post(
        "/api/v1/jobs/file",
        data='name = "x"\n'.encode("utf-16"),
        content_type="application/toml",
        HTTP_AUTHORIZATION=f"Bearer {member_token}",
    )
    assert api.status_code == 422
    assert api.json()["errors"][0]["field"] == "file" and "UTF-8" in api.json()["errors"][0]["message"]
