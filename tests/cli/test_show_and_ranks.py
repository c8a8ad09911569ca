"""`e31 show` names the job a re-run came from, and `e31 logs` of a job on several nodes says how to read the
others' logs (it reads rank 0 unless told)."""

from typer.testing import CliRunner

from e31cli import main


class OneLog:
    def __init__(self, ranks: int) -> None:
        self.ranks = ranks

    def get(self, path, **params):
        return {"attempt": 1, "rank": params["rank"], "ranks": self.ranks, "latest_attempt": 1, "offset": 0,
                "next_offset": 6, "text": "hello\n", "complete": True, "retry_after_s": 0, "removed": ""}  # fmt: skip


def test_the_log_of_one_rank_of_several_says_how_to_read_the_others(monkeypatch):
    """Reproduction: `e31 logs 41 -f` of a two-node job printed rank 0's log, with no word of rank 1's."""
    monkeypatch.setattr(main, "api", lambda: OneLog(ranks=2))
    result = CliRunner().invoke(main.app, ["logs", "41"])
    assert result.exit_code == 0 and result.stdout == "hello\n"
    assert "rank 0 of 2" in result.stderr and "--rank 1" in result.stderr, result.stderr
    monkeypatch.setattr(main, "api", lambda: OneLog(ranks=1))
    alone = CliRunner().invoke(main.app, ["logs", "41"])
    assert alone.exit_code == 0 and alone.stderr == ""


class OneJob:
    def get(self, path, **params):
        return {"id": 41, "name": "again", "team": "vision", "state": "queued", "end_reason": "", "exit_code": None,
                "end_detail": "", "pending_reason": "", "estimated_start": None, "rerun_of": 2, "events": [],
                "work": {"argv": ["true"]}, "request": {"gpus": 1, "hours": 1.0}, "output": {"uri": "file:///o"}}  # fmt: skip


def test_show_names_the_job_a_re_run_came_from(monkeypatch):
    monkeypatch.setattr(main, "api", lambda: OneJob())
    result = CliRunner().invoke(main.app, ["show", "41"])
    assert result.exit_code == 0 and "  re-run of job 2" in result.stdout.splitlines(), result.stdout
