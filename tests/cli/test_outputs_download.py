"""`e31 outputs --download` writes only inside the folder it was given, whatever paths the server lists, and
only files whose size and sha256 are the ones listed."""

import hashlib

import requests
from typer.testing import CliRunner

from e31cli import main


class FakeApi:
    """Lists ``paths``, each as the bytes of ``listed`` (b"x" by default), and serves ``served`` (the same
    unless told), after which it fails with ``cut`` if given: a transfer the network broke."""

    def __init__(self, paths, *, listed=b"x", served=None, cut=None):
        self.paths, self.listed, self.cut = paths, listed, cut
        self.served = listed if served is None else served
        self.fetched = []

    def get(self, path):
        return {"outputs": {"files": len(self.paths)}}

    def pages(self, path, limit):
        digest = hashlib.sha256(self.listed).hexdigest()
        return [{"path": p, "bytes": len(self.listed), "sha256": digest} for p in self.paths]

    def download(self, url, target, *, path):
        self.fetched.append(path)
        target.write_bytes(self.served)
        if self.cut:
            raise self.cut
        return len(self.served)


def download(monkeypatch, fake, folder):
    monkeypatch.setattr(main, "api", lambda: fake)
    return CliRunner().invoke(main.app, ["outputs", "7", "--download", str(folder)])


def files_under(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def test_paths_leaving_the_folder_are_skipped_and_the_rest_downloaded(monkeypatch, tmp_path):
    fake = FakeApi(["ok/a.txt", "/etc/cron.d/x", "../escape.txt", "ok/../../up.txt"])
    result = download(monkeypatch, fake, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert fake.fetched == ["ok/a.txt"]
    assert files_under(tmp_path) == ["out/ok/a.txt"]
    assert (tmp_path / "out/ok/a.txt").read_bytes() == b"x"


def test_a_file_whose_bytes_are_not_the_listed_ones_is_not_saved_and_the_command_fails(monkeypatch, tmp_path):
    """What the console sent went straight under the file's name, checked against nothing: a proxy's error
    page or another file's bytes read as the job's output."""
    result = download(monkeypatch, FakeApi(["model.bin"], listed=b"weights", served=b"wrong!!"), tmp_path)
    assert result.exit_code != 0, result.output
    assert files_under(tmp_path) == []
    assert "model.bin" in result.stderr and "sha256" in result.stderr, result.stderr


def test_a_file_cut_short_is_not_saved_and_names_its_size(monkeypatch, tmp_path):
    result = download(monkeypatch, FakeApi(["model.bin"], listed=b"weights", served=b"wei"), tmp_path)
    assert result.exit_code != 0, result.output
    assert files_under(tmp_path) == []
    assert "model.bin" in result.stderr and "3 bytes" in result.stderr and "7" in result.stderr, result.stderr


def test_a_transfer_the_network_broke_leaves_no_partial_file(monkeypatch, tmp_path):
    cut = requests.ConnectionError("Connection broken: IncompleteRead")
    result = download(
        monkeypatch, FakeApi(["model.bin"], listed=b"weights", served=b"wei", cut=cut), tmp_path
    )
    assert result.exit_code != 0, result.output
    assert files_under(tmp_path) == []
    assert "model.bin" in result.stderr, result.stderr


def test_an_output_named_like_a_temporary_file_is_saved_too(monkeypatch, tmp_path):
    """The temporary name of ``model.bin`` was ``.model.bin.part``: a job's own output of that name, listed first,
    was saved and then removed as the temporary file of the next one, and the command said both were saved."""
    fake = FakeApi([".model.bin.part", "model.bin"])
    result = download(monkeypatch, fake, tmp_path)
    assert result.exit_code == 0, result.output
    assert files_under(tmp_path) == [".model.bin.part", "model.bin"]


def test_a_file_already_in_the_folder_under_a_temporary_looking_name_is_left_alone(monkeypatch, tmp_path):
    (tmp_path / ".model.bin.part").write_bytes(b"mine")
    result = download(monkeypatch, FakeApi(["model.bin"]), tmp_path)
    assert result.exit_code == 0, result.output
    assert (tmp_path / ".model.bin.part").read_bytes() == b"mine"


def test_a_saved_file_gets_the_mode_the_umask_gives_not_the_temporary_files_0600(monkeypatch, tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        result = download(monkeypatch, FakeApi(["model.bin"]), tmp_path)
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE((tmp_path / "model.bin").stat().st_mode) == 0o644


def test_a_file_already_in_the_folder_is_not_replaced_and_nothing_is_downloaded(monkeypatch, tmp_path):
    """Reproduction: a job sealed `.ssh/authorized_keys` and `.bashrc`; a teammate's `e31 outputs 7 --download ~`
    replaced both, silently, and exited 0."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh/authorized_keys").write_text("ssh-ed25519 AAAA-mine\n")
    (tmp_path / ".bashrc").write_text("# mine\n")
    fake = FakeApi([".ssh/authorized_keys", ".bashrc", "model.bin"], listed=b"ssh-ed25519 AAAA-theirs\n")
    result = download(monkeypatch, fake, tmp_path)
    assert result.exit_code == main.EXIT_CONFLICT, result.output
    assert fake.fetched == []
    assert (tmp_path / ".ssh/authorized_keys").read_text() == "ssh-ed25519 AAAA-mine\n"
    assert (tmp_path / ".bashrc").read_text() == "# mine\n"
    assert not (tmp_path / "model.bin").exists()
    assert (
        ".ssh/authorized_keys" in result.stderr and ".bashrc" in result.stderr and "--force" in result.stderr
    )


def test_force_replaces_them(monkeypatch, tmp_path):
    (tmp_path / "model.bin").write_bytes(b"old")
    fake = FakeApi(["model.bin"], listed=b"new")
    monkeypatch.setattr(main, "api", lambda: fake)
    result = CliRunner().invoke(main.app, ["outputs", "7", "--download", str(tmp_path), "--force"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "model.bin").read_bytes() == b"new"


def test_a_file_already_there_with_the_listed_bytes_is_kept_without_downloading_it_again(
    monkeypatch, tmp_path
):
    """A download cut halfway and started again: what already arrived whole is not fetched twice."""
    (tmp_path / "a.bin").write_bytes(b"x")
    fake = FakeApi(["a.bin", "b.bin"])
    result = download(monkeypatch, fake, tmp_path)
    assert result.exit_code == 0, result.output
    assert fake.fetched == ["b.bin"]
    assert "a.bin: already there" in result.stderr


def test_a_path_this_systems_paths_would_read_otherwise_is_skipped(monkeypatch, tmp_path):
    """On Windows `..\\..\\x.bat` and `C:\\Users\\x.bat` passed the check made with POSIX rules."""
    from pathlib import PureWindowsPath

    monkeypatch.setattr(main, "LocalPath", PureWindowsPath)
    fake = FakeApi(["ok.txt", "..\\..\\Startup\\x.bat", "C:\\Users\\Public\\x.bat", "dir/c:x.bat"])
    result = download(monkeypatch, fake, tmp_path)
    assert result.exit_code == 0, result.output
    assert fake.fetched == ["ok.txt"]
    assert result.stderr.count("not a path inside the output folder") == 3, result.stderr


def test_an_output_whose_folder_is_a_file_here_is_not_saved_and_the_rest_is(monkeypatch, tmp_path):
    """A traceback ended the command when a file of the folder stood where an output's folder goes."""
    (tmp_path / "logs").write_text("mine")
    fake = FakeApi(["logs/run.txt", "model.bin"])
    result = download(monkeypatch, fake, tmp_path)
    assert result.exit_code == main.EXIT_API, result.output
    assert fake.fetched == ["model.bin"] and (tmp_path / "logs").read_text() == "mine"
    assert "logs/run.txt: not saved: its folder cannot be made" in result.stderr, result.stderr
