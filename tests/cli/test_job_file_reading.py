"""`e31 submit FILE` reads the job file as the console will, and says what is wrong with it before sending it: a
byte-order mark is no part of the TOML, a file in another encoding than UTF-8 or over the console's limit is an
invalid job file (exit 6) with nothing sent."""

import pytest

from e31cli import main
from jobs import declaration
from tests.cli.test_exit_codes import answered_by_adapter, exit_of

JOB = {"id": 7, "name": "train", "state": "submitted", "array": None, "rerun_of": None, "budget_note": ""}
TOML = 'name = "train"\n[work]\nargv = ["python", "train.py"]\n'


@pytest.fixture
def console(monkeypatch):
    monkeypatch.setenv("E31_URL", "https://console.test")
    monkeypatch.setenv("E31_TOKEN", "e31_x")
    return answered_by_adapter(monkeypatch, 201, JOB)


def test_a_job_file_with_a_byte_order_mark_is_sent_as_its_toml(monkeypatch, capsys, console, tmp_path):
    """Saved "UTF-8 with BOM" (Notepad, Visual Studio), it was refused as "not valid TOML: Invalid statement (at
    line 1, column 1)": the mark went to the console as the file's first character."""
    path = tmp_path / "train.toml"
    path.write_bytes(b"\xef\xbb\xbf" + TOML.encode())
    code, stderr = exit_of(monkeypatch, capsys, "submit", str(path))
    assert code == 0, stderr
    assert [r.body for r in console] == [TOML.encode()]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le"], ids=["with a mark", "without"])
def test_a_utf16_job_file_is_not_utf8_text_and_is_not_sent(monkeypatch, capsys, console, tmp_path, encoding):
    """As PowerShell's `>` saves it: with its byte-order mark, or without (then every other byte is a NUL)."""
    path = tmp_path / "train.toml"
    path.write_bytes(TOML.encode(encoding))
    code, stderr = exit_of(monkeypatch, capsys, "submit", str(path))
    assert (code, console) == (main.EXIT_INVALID, []), stderr
    assert "is not UTF-8 text" in stderr and "UTF-16" in stderr and "save it as UTF-8" in stderr, stderr


def test_a_job_file_over_the_consoles_limit_is_refused_before_it_is_sent(
    monkeypatch, capsys, console, tmp_path
):
    """A 30 MB file was sent whole, then refused "Error 413 … larger than the 2.6 MB" (exit 1): neither the
    console's 256 KB limit nor an invalid job file's exit code."""
    path = tmp_path / "train.toml"
    path.write_text(TOML + "#" * (30 * 2**20) + "\n")
    code, stderr = exit_of(monkeypatch, capsys, "submit", str(path))
    assert (code, console) == (main.EXIT_INVALID, []), stderr
    assert "at most 256 KB" in " ".join(stderr.split()), stderr


def test_a_job_file_of_the_limit_exactly_is_sent_its_mark_not_counted(monkeypatch, capsys, console, tmp_path):
    path = tmp_path / "train.toml"
    text = TOML + "#" * (declaration.MAX_JOB_FILE_BYTES - len(TOML) - 1) + "\n"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    code, stderr = exit_of(monkeypatch, capsys, "submit", str(path))
    assert code == 0, stderr
    assert [len(r.body) for r in console] == [declaration.MAX_JOB_FILE_BYTES]


def test_the_cli_holds_job_files_to_the_consoles_own_limit():
    """Named twice (the CLI does not import the console's Django modules, which would slow every command): held
    equal here."""
    assert main.MAX_JOB_FILE_BYTES == declaration.MAX_JOB_FILE_BYTES == 256 * 1024
