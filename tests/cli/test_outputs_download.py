"""`e31 outputs --download` writes only inside the folder it was given, whatever paths the server lists."""

from typer.testing import CliRunner

from e31cli import main


class FakeApi:
    def __init__(self, paths):
        self.paths = paths
        self.fetched = []

    def get(self, path):
        return {"outputs": {"files": len(self.paths)}}

    def pages(self, path, limit):
        return [{"path": p, "bytes": 1, "sha256": "0" * 64} for p in self.paths]

    def download(self, url, target, *, path):
        self.fetched.append(path)
        target.write_text("x")
        return 1


def test_paths_leaving_the_folder_are_skipped_and_the_rest_downloaded(monkeypatch, tmp_path):
    fake = FakeApi(["ok/a.txt", "/etc/cron.d/x", "../escape.txt", "ok/../../up.txt"])
    monkeypatch.setattr(main, "api", lambda: fake)
    folder = tmp_path / "out"
    result = CliRunner().invoke(main.app, ["outputs", "7", "--download", str(folder)])
    assert result.exit_code == 0, result.output
    assert fake.fetched == ["ok/a.txt"]
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()] == [
        "out/ok/a.txt"
    ]
