"""Re-run: any of the team's jobs cloned into a prefilled form, or submitted again by the API and the CLI."""

import dataclasses
import json

import pytest

from jobs import agent, declaration
from jobs.models import DataInput, Job, JobArray
from tests.cli.inprocess import e31
from tests.factories import JobFactory, MembershipFactory, TeamFactory, UserFactory
from tests.jobs.formparse import form_fields

pytestmark = pytest.mark.django_db


@pytest.fixture
def source(team, member, roots):
    data, out = roots
    (data / "corpus.tar").write_bytes(b"x" * 10)
    job = JobFactory(
        team=team, submitted_by=member, name="train-q3", state="released", end_reason="failed", exit_code=2,
        argv=["python3", "train.py", "--lr=0.1"], env={"SEED": "7"}, gpus=2, hours=1.5, preemptible=True,
        memory_bytes=2_000_000_000, output_uri=f"file://{out}/train", output_bytes=5000,
    )  # fmt: skip
    DataInput.objects.create(job=job, position=0, name="corpus", uri=f"file://{data}/corpus.tar", bytes=10)
    return job


def test_the_rerun_page_is_the_submit_form_filled_from_the_source(member_client, source, pool):
    page = member_client.get(f"/jobs/{source.id}/rerun/")
    assert page.status_code == 200
    html = page.content.decode()
    for shown in (
        "train-q3",
        "--lr=0.1",
        "SEED=7",
        'value="1.5"',
        source.output_uri,
        "corpus.tar",
        "2000000000",
    ):
        assert shown in html
    assert f'name="rerun_of" value="{source.id}"' in html


def test_submitting_the_prefilled_form_makes_a_job_linked_to_its_source(member_client, source, pool):
    form = {
        "name": "train-q3", "work.argv": "python3\ntrain.py\n--lr=0.05", "request.gpus": "2",
        "request.hours": "1.5", "output.uri": source.output_uri, "output.bytes": "5000",
        "rerun_of": str(source.id),
    }  # fmt: skip
    answer = member_client.post("/jobs/new/", form)
    assert answer.status_code == 302
    rerun = Job.objects.exclude(id=source.id).get()
    assert rerun.rerun_of_id == source.id and rerun.argv[-1] == "--lr=0.05"
    page = member_client.get(f"/jobs/{rerun.id}/").content.decode()
    assert f'href="/jobs/{source.id}/"' in page and "Re-run of" in page
    assert f"/jobs/{rerun.id}/" in member_client.get(f"/jobs/{source.id}/").content.decode()


def test_another_teams_job_cannot_be_cloned_nor_linked(outsider_client, outsider, source, pool, roots):
    assert outsider_client.get(f"/jobs/{source.id}/rerun/").status_code == 404
    _, out = roots
    form = {
        "name": "mine", "work.argv": "true", "request.gpus": "1", "request.hours": "1",
        "output.uri": f"file://{out.parent}/audio/x", "output.bytes": "10", "rerun_of": str(source.id),
    }  # fmt: skip
    answer = outsider_client.post("/jobs/new/", form)
    assert answer.status_code == 422 and Job.objects.filter(name="mine").count() == 0
    assert "rerun_of" in answer.content.decode()


def _resubmit_unchanged(client, source: Job):
    fields = form_fields(client.get(f"/jobs/{source.id}/rerun/").content.decode())
    return client.post("/jobs/new/", {**fields, "action": "submit"})


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["sh", "-c", "set -e\npython prep.py\npython train.py"], id="a script of several lines"),
        pytest.param(["python3", "train.py", "--tag", "", "--epochs", "3"], id="an empty argument"),
        pytest.param(["python3", " padded ", "[1]"], id="an argument edged with spaces"),
    ],
)
def test_a_rerun_submitted_unchanged_runs_the_same_argv(member_client, member, team, roots, pool, argv):
    """A member opens Re-run… on a job whose argv one line per argument cannot hold (a ``sh -c`` script,
    an empty ``--tag ""``) and presses Submit untouched: the Command box holds it as a JSON list, and
    the re-run runs exactly the source's argv."""
    _, out = roots
    source = JobFactory(
        team=team, submitted_by=member, state="released", end_reason="failed", exit_code=1,
        argv=argv, output_uri=f"file://{out}/r", output_bytes=10,
    )  # fmt: skip
    answer = _resubmit_unchanged(member_client, source)
    assert answer.status_code == 302, answer.content.decode()[:3000]
    assert Job.objects.exclude(id=source.id).get().argv == argv


def test_adding_or_removing_an_input_keeps_the_form_a_rerun(member_client, member, team, roots, pool):
    """On the Re-run… form a member presses "+ Add an input", then Remove on the new row: the form comes
    back each time still a re-run of the source (its hidden ``rerun_of`` and its "Re-run of #N" line)."""
    _, out = roots
    source = JobFactory(
        team=team, submitted_by=member, state="released", end_reason="failed", exit_code=1,
        argv=["python3", "train.py"], output_uri=f"file://{out}/r", output_bytes=10,
    )  # fmt: skip
    fields = form_fields(member_client.get(f"/jobs/{source.id}/rerun/").content.decode())
    for action in ("add-input", "remove-input-1"):
        answer = member_client.post("/jobs/new/", {**fields, "action": action}, HTTP_HX_REQUEST="true")
        assert answer.status_code == 200
        fields = form_fields(answer.content.decode())
        assert fields.get("rerun_of") == str(source.id)
        assert f'Re-run of <a href="/jobs/{source.id}/">' in answer.content.decode()


def api_rerun(client, token, job_id, key=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if key:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return client.post(f"/api/v1/jobs/{job_id}/rerun", **headers)


def test_the_api_reruns_a_job_with_its_declaration_and_link(client, member_token, source, pool):
    answer = api_rerun(client, member_token, source.id)
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["rerun_of"] == source.id and body["state"] == "submitted"
    assert body["work"]["argv"] == source.argv and body["request"]["gpus"] == 2
    assert [d["name"] for d in body["data"]] == ["corpus"]
    assert (
        client.get(f"/api/v1/jobs/{source.id}", HTTP_AUTHORIZATION=f"Bearer {member_token}").json()[
            "rerun_of"
        ]
        is None
    )


def test_an_api_rerun_of_a_checkpointing_job_keeps_its_checkpoint(
    client, member_token, team, member, roots, pool
):
    _, out = roots
    pausable = JobFactory(
        team=team, submitted_by=member, state="released", end_reason="failed", argv=["python3", "train.py"],
        gpus=1, preemptible=True, checkpoint_signal="USR1", checkpoint_grace_s=300, checkpoint_bytes=5 * 2**30,
        output_uri=f"file://{out}/p", output_bytes=10,
    )  # fmt: skip
    answer = api_rerun(client, member_token, pausable.id)
    assert answer.status_code == 201, answer.content
    rerun = Job.objects.get(id=answer.json()["id"])
    kept = (rerun.checkpoint_signal, rerun.checkpoint_grace_s, rerun.checkpoint_bytes)
    assert kept == ("USR1", 300, 5 * 2**30)


def test_a_rerun_of_an_array_task_runs_with_that_tasks_index(
    client, member_client, member_token, source, pool
):
    array = JobArray.objects.create(team=source.team, name=source.name, spec="0-3", size=4, max_running=None,
                                    first_index=0, submitted_at=source.submitted_at)  # fmt: skip
    Job.objects.filter(id=source.id).update(array=array, array_index=2)
    answer = api_rerun(client, member_token, source.id)
    assert answer.status_code == 201, answer.content
    rerun = Job.objects.select_related("array").get(id=answer.json()["id"])
    # The task's program reads $E31_ARRAY_INDEX to pick its shard: without it the re-run does other work.
    assert agent._array_env(rerun)["E31_ARRAY_INDEX"] == "2" and rerun.array.size == 1
    assert 'name="array" value="2"' in member_client.get(f"/jobs/{source.id}/rerun/").content.decode()


def test_a_declaration_written_as_a_job_file_reads_back_whole():
    """What a re-run submits is ``as_mapping`` read by the rules again: a part it left out would be dropped."""
    spec = declaration.Declaration(
        name="full", argv=["python3", "train.py"], env={"SEED": "7"}, image="registry.example.com/t/app:1",
        workdir="src", secrets=["WANDB_API_KEY"],
        data=[declaration.DataInput("corpus", "https://data.example.com/c.bin", 10, "a" * 64)],
        gpus=2, gpu_model="H100", hours=2.0, min_gpus=1, max_gpus=4, preemptible=True, requeue=True,
        memory_bytes=8 * 2**30, cpus=6.0, checkpoint=declaration.Checkpoint("USR1", 300, 2**30),
        output_uri="s3://bucket/teams/vision/out/", output_bytes=100, after_ok=(812,), after_any=(813,),
        array=declaration.Array(indices=(0, 1, 2), limit=2, text="0-2%2"),
    )  # fmt: skip
    assert all(getattr(spec, f.name) not in (None, "", (), [], False) for f in dataclasses.fields(spec))
    limits = declaration.Limits(
        pool_gpus=8, max_hours=168.0, data_roots=[], output_roots=[], s3_roots=["s3://bucket/teams"]
    )
    assert declaration.validate(declaration.as_mapping(spec), limits=limits) == spec


def test_an_api_rerun_retried_with_its_key_makes_one_job(client, member_token, source, pool):
    first = api_rerun(client, member_token, source.id, key="again-1")
    again = api_rerun(client, member_token, source.id, key="again-1")
    assert (first.status_code, again.status_code) == (201, 200) and first.json()["id"] == again.json()["id"]
    assert Job.objects.filter(rerun_of=source).count() == 1


def test_the_api_refuses_another_teams_job_with_404(client, outsider, source, pool):
    from accounts import services as accounts

    _, token = accounts.create_api_token(user=outsider, label="t")
    assert api_rerun(client, token, source.id).status_code == 404
    assert not Job.objects.filter(rerun_of=source).exists()


def test_a_source_whose_declaration_no_longer_passes_is_refused_naming_the_field(
    client, member_token, source, pool, settings, tmp_path
):
    settings.E31_OUTPUT_ROOTS = [tmp_path / "elsewhere"]  # the destination is no longer under an output root
    answer = api_rerun(client, member_token, source.id)
    assert answer.status_code == 422 and "output.uri" in json.dumps(answer.json())


def test_a_member_of_several_teams_reruns_into_the_sources_team(client, member, member_token, source, pool):
    MembershipFactory(team=TeamFactory(name="nlp", slug="nlp"), user=member)
    answer = api_rerun(client, member_token, source.id)
    assert answer.status_code == 201 and answer.json()["team"] == "vision"


def test_e31_submit_from_an_id_reruns_it(monkeypatch, member_token, source, pool):
    code, out, err = e31(monkeypatch, member_token, "submit", "--from", str(source.id))
    assert code == 0, err
    rerun = Job.objects.get(rerun_of=source)
    assert out.strip() == str(rerun.id) and f"re-run of {source.id}" in err


def test_e31_submit_needs_a_file_or_a_source_not_both(monkeypatch, member_token, source, pool, tmp_path):
    assert e31(monkeypatch, member_token, "submit")[0] == 2
    job_file = tmp_path / "j.toml"
    job_file.write_text('name = "x"\n')
    assert e31(monkeypatch, member_token, "submit", str(job_file), "--from", str(source.id))[0] == 2
    assert e31(monkeypatch, member_token, "submit", "--from", "999999")[0] == 4


def test_another_team_member_cannot_rerun_through_the_cli(monkeypatch, source, pool):
    from accounts import services as accounts

    stranger = MembershipFactory(
        team=TeamFactory(name="nlp", slug="nlp"), user=UserFactory(username="n")
    ).user
    _, token = accounts.create_api_token(user=stranger, label="t")
    assert e31(monkeypatch, token, "submit", "--from", str(source.id))[0] == 4
