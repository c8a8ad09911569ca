"""`e31` piped into another program writes one line per record, whatever the record's length."""

import json

import pytest
from typer.testing import CliRunner

from e31cli import main
from tests.cli.inprocess import e31
from tests.cli.test_outputs_download import FakeApi
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_a_long_job_name_stays_on_its_row_when_the_list_is_piped(monkeypatch, team, member_token):
    """`e31 ls | grep` lost rows: with no terminal rich laid the table out 80 columns wide and folded a
    120-character name over three lines, so the job's id and its name's end were on different lines."""
    name = "sweeps-" + "-".join(f"lr{n:03d}" for n in range(19))  # 120 characters
    assert len(name) == 120
    job = JobFactory(team=team, name=name)
    code, out, err = e31(monkeypatch, member_token, "ls")
    assert code == 0, err
    row = [line for line in out.splitlines() if line.startswith(str(job.id))]
    assert len(row) == 1 and name in row[0], out
    assert len(out.splitlines()) == 2, out  # the head and the one job


def test_a_long_command_line_stays_on_its_line_when_show_is_piped(monkeypatch, team, member_token):
    job = JobFactory(team=team, name="x" * 120, argv=["python", "train.py", "--config", "c" * 200])
    code, out, err = e31(monkeypatch, member_token, "show", str(job.id))
    assert code == 0, err
    assert f"  argv: python train.py --config {'c' * 200}" in out.splitlines(), out


ESCAPES = "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\ \x1b[2J\x1b[H \x1b]52;c;cHduZWQ=\x07 \x1b[1mbold\x1b[0m"
SHOWN = "\ufffd]8;;https://evil.example/\ufffd\\click\ufffd]8;;\ufffd\\ \ufffd[2J\ufffd[H \ufffd]52;c;cHduZWQ=\ufffd \x1b[1mbold\x1b[0m"


def test_on_a_terminal_a_teammates_command_line_never_drives_the_terminal(monkeypatch, team, member_token):
    """A teammate's job ran `python -c` with escape sequences in its arguments; `e31 show` printed them as they
    were: a hidden hyperlink, a cleared screen, a clipboard write. Colours stay, as in `e31 logs`."""
    job = JobFactory(team=team, name="train", argv=["python", "-c", ESCAPES])
    monkeypatch.setattr(main, "_stdout_is_terminal", lambda: True)
    code, out, err = e31(monkeypatch, member_token, "show", str(job.id))
    assert code == 0, err
    assert f"  argv: python -c '{SHOWN}'" in out.splitlines(), repr(out)


def test_on_a_terminal_the_names_a_job_gave_its_output_files_never_drive_the_terminal(monkeypatch, tmp_path):
    """A job names its output files: `e31 outputs` printed a name with escape sequences as it was, in the table on
    stdout and in the download's progress on stderr."""
    fake = FakeApi([f"{ESCAPES}.txt"])
    monkeypatch.setattr(main, "api", lambda: fake)
    monkeypatch.setattr(main, "_stdout_is_terminal", lambda: True)
    monkeypatch.setattr(main, "_stderr_is_terminal", lambda: True)
    listed = CliRunner().invoke(main.app, ["outputs", "7"])
    fetched = CliRunner().invoke(main.app, ["outputs", "7", "--download", str(tmp_path)])
    assert listed.exit_code == fetched.exit_code == 0, (listed.output, fetched.output)
    assert f"{SHOWN}.txt" in listed.stdout and f"{SHOWN}.txt: 1 bytes" in fetched.stderr, (
        listed.stdout,
        fetched.stderr,
    )
    assert (tmp_path / f"{ESCAPES}.txt").read_text() == "x"  # the file keeps the name the job gave it


# OSC 52 (a clipboard write) and CSI 2J (a cleared screen), each in its one-character C1 form.
C1_ESCAPES = "\x9d52;c;cHduZWQ=\x9c\x9b2J"


@pytest.mark.parametrize("command", ["ls", "show"])
def test_json_output_writes_no_c1_control_and_reads_back_the_same(monkeypatch, team, member_token, command):
    """`--json` went through rich's print_json, which writes U+0080-U+009F raw, past the filter of every other
    output: a job name could write the reader's clipboard or clear the screen. Escaped as \\u00XX, the JSON
    still reads back as the job's own text, and a name in another alphabet stays readable."""
    name = f"Überprüfung {C1_ESCAPES}"
    job = JobFactory(team=team, name=name, end_detail=C1_ESCAPES)
    code, out, err = e31(
        monkeypatch, member_token, command, *([str(job.id)] if command == "show" else []), "--json"
    )
    assert code == 0, err
    assert not [c for c in out if "\x80" <= c <= "\x9f"], repr(out)
    assert (json.loads(out)["name"], json.loads(out)["end_detail"]) == (name, C1_ESCAPES)
    assert "Überprüfung" in out


def test_a_list_of_several_teams_jobs_names_each_ones_team(
    monkeypatch, team, other_team, member, member_token
):
    """A member of two teams (or an operator) read `e31 ls` with both teams' jobs mixed and nothing telling them
    apart; one team's list stays as it was."""
    from accounts.models import Membership

    Membership.objects.create(team=other_team, user=member)
    mine, theirs = JobFactory(team=team, name="vision-job"), JobFactory(team=other_team, name="audio-job")
    code, out, err = e31(monkeypatch, member_token, "ls")
    assert code == 0, err
    head, *rows = out.splitlines()
    assert "TEAM" in head.split()
    assert any(r.startswith(str(mine.id)) and "vision" in r.split() for r in rows), out
    assert any(r.startswith(str(theirs.id)) and "audio" in r.split() for r in rows), out
    code, out, err = e31(monkeypatch, member_token, "ls", "--team", "vision")
    assert code == 0 and "TEAM" not in out.splitlines()[0].split(), out
