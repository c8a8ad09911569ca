"""Hostile job files and forms: the parser and the rules refuse with DeclarationInvalid, never anything else,
and the submit form answers 200/302/400/422 (204 to htmx), never a server error."""

from pathlib import Path

import pytest
import tomli_w
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs import declaration
from jobs.forms import JobForm

FAST = settings(max_examples=400, deadline=None, database=None, derandomize=True)
THROUGH_DJANGO = settings(
    max_examples=120, deadline=None, database=None, derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)  # fmt: skip


ROOT = Path("/tmp/e31-hostile")
LIMITS = declaration.Limits(pool_gpus=8, max_hours=168.0, data_roots=[ROOT], output_roots=[ROOT])


# Text a browser or an API client can send: anything but lone surrogates, NUL and controls included.
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=60)
SCALARS = (
    TEXT | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.booleans()
    | st.datetimes() | st.dates() | st.times()
)  # fmt: skip
TOML_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)
KEYS = ("name", "work", "data", "request", "output", "team", "argv", "gpus", "uri", "bytes")


def shaped() -> st.SearchStrategy[dict]:
    """The four parts with the right keys and hostile values: reaches every field's rules."""
    part = lambda keys: st.fixed_dictionaries({}, optional={k: TOML_VALUES for k in keys})  # noqa: E731
    data_item = part(("name", "uri", "bytes", "sha256")) | TOML_VALUES
    return st.fixed_dictionaries(
        {},
        optional={
            "name": TOML_VALUES,
            "work": part(("argv", "env", "image", "workdir")) | TOML_VALUES,
            "data": st.lists(data_item, max_size=3) | TOML_VALUES,
            "request": part(("gpus", "hours", "min_gpus", "gpu_model", "preemptible", "requeue"))
            | TOML_VALUES,
            "output": part(("uri", "bytes")) | TOML_VALUES,
        },
    )


def refused_or_valid(raw: object) -> None:
    try:
        declaration.validate(raw, limits=LIMITS)
    except declaration.DeclarationInvalid as exc:
        assert exc.errors and all(isinstance(p, str) and isinstance(m, str) for p, m in exc.errors)


@FAST
@given(text=st.text(max_size=400) | st.sampled_from(['name = "x"\n[work]\nargv = ["a"]', "[[data]]\n" * 30]))
def test_any_text_as_a_job_file_is_parsed_or_refused_with_a_field_error(text):
    try:
        raw = declaration.parse_job_file(text)
    except declaration.DeclarationInvalid as exc:
        assert exc.errors[0][0] == "file"
        return
    refused_or_valid(raw)


@FAST
@given(raw=st.dictionaries(st.sampled_from(KEYS) | TEXT, TOML_VALUES, max_size=6) | shaped())
def test_any_toml_document_is_validated_or_refused_never_crashes(raw):
    try:
        text = tomli_w.dumps(raw)
    except (
        TypeError,
        ValueError,
    ):  # not representable in TOML (e.g. a NaN in some positions): validate it as is
        refused_or_valid(raw)
        return
    refused_or_valid(declaration.parse_job_file(text))


@FAST
@given(raw=shaped() | TOML_VALUES)
def test_any_value_in_any_part_is_validated_or_refused(raw):
    refused_or_valid(raw)


BROKEN_URIS = (
    "https://[::1/x",
    "https://[notip]/x",
    "s3://[bucket/x",
    "https://h:99999/x",
    "https://h:abc/x",
)


@pytest.mark.parametrize("uri", [*BROKEN_URIS, f"file://{ROOT}/a%00b"])
@pytest.mark.parametrize("field", ["data[0].uri", "output.uri"])
def test_a_uri_the_parser_cannot_read_is_a_field_error_never_a_value_error(uri, field):
    """urlsplit raises on a broken "[" host, reading the port on ":99999", os.path on a NUL byte."""
    data = [{"name": "a", "uri": uri if field == "data[0].uri" else "https://h/x", "bytes": 1}]
    output = {"uri": uri if field == "output.uri" else "", "bytes": 0}
    raw = {
        "name": "x",
        "work": {"argv": ["true"]},
        "request": {"gpus": 1, "hours": 1},
        "data": data,
        "output": output,
    }
    with pytest.raises(declaration.DeclarationInvalid) as refused:
        declaration.validate(raw, limits=LIMITS)
    assert refused.value.as_dict()[field].startswith(("not a valid URI: ", "a file URI cannot hold a NUL"))


def test_an_env_of_thousands_of_bad_names_is_one_error_not_one_each():
    raw = {"name": "x", "work": {"argv": ["true"], "env": {f"{i}BAD": "x" for i in range(5000)}}}
    with pytest.raises(declaration.DeclarationInvalid) as refused:
        declaration.validate(raw, limits=LIMITS)
    assert [m for p, m in refused.value.errors if p.startswith("work.env")] == ["at most 128 variables"]


FIELDS = (
    "name", "work.argv", "work.env", "work.image", "work.workdir", "request.gpus", "request.hours",
    "request.min_gpus", "request.gpu_model", "request.preemptible", "request.requeue", "output.uri",
    "output.bytes", "team", "job_file",
)  # fmt: skip
ROW_FIELD = st.builds(
    "data[{}].{}".format,
    st.integers(0, 80) | st.sampled_from([10**30, -1]),
    st.sampled_from(["name", "uri", "bytes", "sha256", "x"]),
)
ACTIONS = st.sampled_from(
    ["submit", "add-input", "load-file", "submit-file", "remove-input-0", "remove-input-99"]
)
POSTS = st.dictionaries(st.sampled_from(FIELDS) | ROW_FIELD | TEXT, TEXT, max_size=12).flatmap(
    lambda post: st.builds(lambda action: {**post, "action": action}, ACTIONS | TEXT)
)


@FAST
@given(post=POSTS)
def test_the_form_turns_any_post_into_a_declaration_the_rules_can_judge(post):
    form = JobForm.from_post(post)
    refused_or_valid(form.to_declaration())


def valid_post(out: Path) -> dict[str, str]:
    return {
        "name": "fuzz", "work.argv": "/usr/bin/true", "request.gpus": "1", "request.hours": "1",
        "output.uri": f"file://{out}/fuzz", "output.bytes": "1 KB", "action": "submit",
    }  # fmt: skip


# A valid form with a few fields replaced by hostile text: gets past the easy refusals, to the database.
MUTATIONS = st.dictionaries(st.sampled_from(FIELDS[:-2]) | ROW_FIELD, TEXT, min_size=1, max_size=3)


@pytest.mark.django_db
@THROUGH_DJANGO
@given(
    post=POSTS | MUTATIONS.map(lambda m: ("mutate", m)),
    htmx=st.booleans(),
    where=st.sampled_from(["jobs:new", "jobs:estimate"]),
)
def test_posting_anything_to_the_submit_form_never_gets_a_server_error(
    member_client, pool, roots, settings, post, htmx, where
):
    # Hundreds of previews by one member: their limit is not under test here.
    settings.E31_PREVIEW_RATE = "1000000/m"
    if isinstance(post, tuple):
        post = {**valid_post(roots[1]), **post[1]}
    headers = {"HX-Request": "true"} if htmx else {}
    response = member_client.post(reverse(where), post, headers=headers)
    allowed = {200, 302, 400, 422} | ({204} if htmx else set())
    assert response.status_code in allowed, (response.status_code, post)


@pytest.mark.django_db
def test_the_unmutated_valid_post_is_accepted(member_client, pool, roots):
    """Keeps the mutation test honest: its base form really reaches the database."""
    response = member_client.post(reverse("jobs:new"), valid_post(roots[1]))
    assert response.status_code == 302


@pytest.mark.django_db
@THROUGH_DJANGO
@given(
    content=st.binary(max_size=2000) | TEXT.map(str.encode),
    name=st.sampled_from(["job.toml", "../../etc/passwd", "x" * 300]),
)
def test_uploading_any_bytes_as_a_job_file_never_gets_a_server_error(member_client, pool, content, name):
    upload = SimpleUploadedFile(name, content, content_type="application/toml")
    response = member_client.post(reverse("jobs:new"), {"action": "submit-file", "job_file_upload": upload})
    assert response.status_code in {200, 302, 400, 422}


# --------------------------------------------------------------------------- nesting, to 10,000 levels

OPENERS = {"array": ("[", "]"), "table": ("{ a = ", " }"), "object": ('{"a": ', "}")}


def nested(depth: int, kind: str, leaf: str = "1") -> str:
    opener, closer = OPENERS[kind]
    return opener * depth + leaf + closer * depth


DEPTHS = st.integers(1, 10_000) | st.sampled_from(
    [declaration.MAX_NESTING, declaration.MAX_NESTING + 1, 1500]
)
NESTED_FILES = st.builds(
    lambda depth, kind, key: (depth, f"{key} = {nested(depth, kind)}\n"),
    DEPTHS, st.sampled_from(["array", "table"]), st.sampled_from(["a", "name", "data"]),
)  # fmt: skip


@settings(max_examples=150, deadline=None, database=None, derandomize=True)
@given(case=NESTED_FILES)
def test_a_job_file_nested_to_any_depth_is_refused_naming_the_nesting_or_judged(case):
    depth, text = case
    try:
        raw = declaration.parse_job_file(text)
    except declaration.DeclarationInvalid as exc:
        assert exc.errors[0][0] == "file"
        assert depth < declaration.MAX_NESTING or "nested too deeply" in exc.errors[0][1]
        return
    assert depth < declaration.MAX_NESTING  # anything deeper never reaches the rules
    refused_or_valid(raw)


@pytest.mark.django_db
@THROUGH_DJANGO
@given(case=NESTED_FILES, action=st.sampled_from(["load-file", "submit-file"]))
def test_the_form_answers_a_nested_job_file_of_any_depth_without_a_server_error(
    member_client, pool, case, action
):
    depth, text = case
    response = member_client.post(reverse("jobs:new"), {"action": action, "job_file": text})
    assert response.status_code in {200, 400, 422}
    if depth > declaration.MAX_NESTING:
        assert response.status_code == 400 and "nested too deeply" in response.context["form"].errors["file"]


@pytest.mark.django_db
@THROUGH_DJANGO
@given(depth=DEPTHS, kind=st.sampled_from(["array", "object"]), key=st.sampled_from(["name", "request", "x"]))
def test_the_api_answers_a_nested_body_of_any_depth_without_a_server_error(
    member_client, member_token, pool, depth, kind, key
):
    body = f'{{"{key}": {nested(depth, kind)}}}'
    response = member_client.post(
        "/api/v1/jobs",
        data=body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {member_token}",
    )
    assert response.status_code in {400, 422}
    if depth >= declaration.MAX_NESTING:
        assert response.status_code == 400 and "nested too deeply" in response.json()["detail"]
