"""`e31` piped into another program writes one line per record, whatever the record's length."""

import pytest

from tests.cli.inprocess import e31
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
