"""The ``e31`` command: submit, follow and read jobs from a terminal or a script.

Typer, because each command is a typed function whose help, argument checks and completion come from
its signature, and it brings rich for the tables; the API calls go through requests.

Exit codes a script can rely on (``e31 --help`` lists them too):
  0 done; with --wait, the job succeeded and its outputs were delivered (an array: every task)
  1 the console answered with an error not listed below
  2 the command line was wrong (the console refused a filter or an argument: a 422 to any command but submit), or
    the console is plain http:// on another machine (E31_ALLOW_PLAIN_HTTP=1 in a lab)
  3 not logged in, or the token was refused
  4 no such job (or not your team's); ``e31 logs``: its log was removed by retention; ``e31 outputs``: its
    list of files was, with the log
  5 conflict: nothing to cancel, or an Idempotency-Key reused for another job file
  6 the job file is not valid (each error names its field)
  7 the console could not be reached, or still throttled the token (429) after the retries (while --wait or
    --follow polls: after 5 minutes of trying again)
  141 what stdout was piped into stopped reading (`e31 logs 7 | head`): nothing more is printed
With --wait, the job's own exit code when it ran and failed (128 + N when signal N killed it), else
one code per end reason: timed_out 124, cancelled 130, node_lost 75, staging_failed 66,
output_failed 74 (also a success whose outputs could not be delivered), rejected 65,
dependency_failed 67, any other failure 1. An array waits for every task and exits with the highest
of its tasks' codes.
"""

import functools
import hashlib
import itertools
import json
import os
import re
import shlex
import sys
import tempfile
import time
import uuid
from calendar import monthrange
from collections import Counter
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path, PurePath, PurePosixPath
from typing import Annotated, NoReturn, TypeVar
from urllib.parse import urlsplit

import requests
import typer
from rich.console import Console
from rich.table import Table

from e31cli import client, config

app = typer.Typer(help=__doc__.split("\n\n")[0], no_args_is_help=True, add_completion=False,
                  pretty_exceptions_show_locals=False,  # a traceback must never print the token
                  epilog="Exit codes: " + __doc__.split("Exit codes a script can rely on (``e31 --help`` lists them too):")[1])  # fmt: skip
# No markup: job names, argv and the console's messages are printed as they are, never as rich tags.
# Piped into grep, awk or a file, a record stays on one line: with no terminal rich would lay everything out 80
# columns wide and fold long names and command lines, splitting a row from its id.
_PIPED_WIDTH = 100_000
# What the console's API sends on a terminal, a job's log as a teammate's command line or the names a job gave its
# output files: its colours (SGR), tabs, newlines and carriage returns (progress bars) as written; any other control
# character (a hyperlink, a clipboard write, a new window title, a cleared screen, a backspace) shown as U+FFFD.
_COLOUR_OR_CONTROL = re.compile(r"(\x1b\[[0-9;:]*m)|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


# json.dumps escapes C0 controls itself; with ensure_ascii=False (names in any alphabet stay readable) it writes DEL
# and the C1 controls raw, and a terminal acts on U+009B/U+009D as on ESC [ / ESC ] (a cleared screen, a clipboard
# write). As \u00XX they are inert and the JSON reads back the same.
_RAW_IN_JSON = re.compile(r"[\x7f-\x9f]")


def _for_terminal(text: str) -> str:
    return _COLOUR_OR_CONTROL.sub(lambda m: m.group(1) or "\ufffd", text)


def _print_json(value: object, *, indent: int | None) -> None:
    """The API's JSON on stdout, piped or not, with no control character in it raw."""
    text = json.dumps(value, ensure_ascii=False, indent=indent)
    sys.stdout.write(_RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + "\n")


def _stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def _stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


class _Screen(Console):
    """rich's console, printing every string as ``_for_terminal`` shows it while it writes to a terminal; piped, the
    text goes as it is, like a piped log."""

    def __init__(self, on_terminal, **options) -> None:
        super().__init__(highlight=False, markup=False, **options)
        self._on_terminal = on_terminal

    def print(self, *objects, **options) -> None:
        if self._on_terminal():
            objects = tuple(_for_terminal(o) if isinstance(o, str) else o for o in objects)
        super().print(*objects, **options)


class _ScreenTable(Table):
    """A table of stdout whose cells are shown as ``_Screen`` shows a string."""

    def add_row(self, *cells, **options) -> None:
        if _stdout_is_terminal():
            cells = tuple(_for_terminal(c) if isinstance(c, str) else c for c in cells)
        super().add_row(*cells, **options)


out = _Screen(lambda: _stdout_is_terminal(), width=None if sys.stdout.isatty() else _PIPED_WIDTH)
err = _Screen(lambda: _stderr_is_terminal(), stderr=True, width=None if sys.stderr.isatty() else _PIPED_WIDTH)

EXIT_API, EXIT_AUTH, EXIT_NOT_FOUND, EXIT_CONFLICT, EXIT_INVALID, EXIT_UNREACHABLE = 1, 3, 4, 5, 6, 7
EXIT_USAGE = 2  # the code click gives a wrong command line
# A reader of stdout gone (`| head`): the code of a program that SIGPIPE ended, as `cat` gives.
EXIT_PIPE_CLOSED = 128 + 13
# A 429 still answered after the client's retries, or a gateway's 502/503/504 page (a console restarting behind
# its load balancer), says nothing of the job: it exits as an unreachable console, never 1, which under --wait
# reads as "the job failed". The console's own 503 (it cannot read an output's store) keeps 1.
# A 422 is the job file's only as the answer to a submission (ApiError.of_job_file); to any other command, the
# console refused a filter or an argument (`e31 ls --state runnning`): the command line's, EXIT_USAGE.
STATUS_EXITS = {
    401: EXIT_AUTH, 403: EXIT_AUTH, 404: EXIT_NOT_FOUND, 409: EXIT_CONFLICT, 422: EXIT_INVALID,
    429: EXIT_UNREACHABLE,
}  # fmt: skip
GATEWAY_STATUSES = {502, 503, 504}
# The console's limit on a job file (jobs.declaration.MAX_JOB_FILE_BYTES; a test holds the two equal: importing the
# console's Django modules would slow every command), checked before sending: a bigger file was sent whole and
# refused with a 413 naming Django's upload limit, exit 1.
MAX_JOB_FILE_BYTES = 256 * 1024
UTF8_BOM = b"\xef\xbb\xbf"
# The console's rule for an Idempotency-Key (jobs.idempotency.VALID_KEY), checked before anything is sent.
VALID_KEY = re.compile(r"[\x21-\x7e]{1,255}")
END_REASON_EXITS = {
    "succeeded": 0, "timed_out": 124, "cancelled": 130, "node_lost": 75, "staging_failed": 66,
    "output_failed": 74, "rejected": 65, "dependency_failed": 67,
}  # fmt: skip
TERMINAL = {"released", "ended"}
WAIT_POLL_S = 2.0
QUEUE_ROWS = (
    4000  # e31 queue reads this many waiting jobs at most (two teams at E31_MAX_WAITING_PER_TEAM's default)
)
LOG_WAIT_S = 15
# While --wait or --follow polls, a console that cannot be reached (a restart, a deploy) is asked again for this
# long from the first failure, with backoff: the job runs on meanwhile, and giving up after the client's few
# seconds of retries ended a day-long wait with exit 7 over a restart.
UNREACHABLE_PATIENCE_S = 300
UNREACHABLE_BACKOFF_S = (1, 2, 4, 8, 16, 30)  # then every 30 s
_T = TypeVar("_T")


def run() -> None:
    """Entry point: API and connection failures become a message and a documented exit code; a reader of stdout
    that went away (`e31 logs 24 | head -2`) ends the command quietly, with 141."""
    try:
        _run_app()
    except SystemExit as exc:
        if not _reader_gone(exc):
            raise
        _silence_closed_pipes()
        sys.exit(EXIT_PIPE_CLOSED)


def _run_app() -> None:
    try:
        app()
    except config.NotLoggedIn as exc:
        err.print(str(exc), style="red")
        sys.exit(EXIT_AUTH)
    except client.PlainHttpRefused as exc:
        err.print(str(exc), style="red")
        sys.exit(EXIT_USAGE)
    except client.ApiError as exc:
        err.print(f"Error {exc.status}: {exc}", style="red")
        sys.exit(_exit_for(exc))
    except requests.Timeout as exc:
        err.print(f"The console did not answer in time: {exc}", style="red")
        sys.exit(EXIT_UNREACHABLE)
    except requests.exceptions.InvalidHeader:
        # Its message quotes the header's value, and that may be the token: never printed.
        err.print(
            "A request header holds a character HTTP cannot carry (check --key); nothing was sent.",
            style="red",
        )
        sys.exit(EXIT_USAGE)
    except requests.RequestException as exc:
        err.print(f"Cannot reach the console: {exc}", style="red")
        sys.exit(EXIT_UNREACHABLE)


def _reader_gone(exc: SystemExit) -> bool:
    """click, typer and rich each answer EPIPE with exit 1 (a message-less SystemExit raised as they handle it,
    help output included); a command that ended with output still buffered meets it only now, as it is flushed."""
    if isinstance(exc.__context__, BrokenPipeError):
        return True
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return True
    return False


def _silence_closed_pipes() -> None:
    """Nothing more reaches the reader: what is still buffered for it goes to /dev/null, not to one more EPIPE as
    Python flushes at exit ("Exception ignored" on stderr, and exit 120). As the Python docs' note on SIGPIPE does."""
    for stream in (sys.stdout, sys.stderr):  # `e31 logs 7 2>&1 | head`: stderr's reader is gone too
        try:
            stream.flush()
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)


def _exit_for(exc: client.ApiError) -> int:
    if exc.status in GATEWAY_STATUSES and not exc.from_console:
        return EXIT_UNREACHABLE
    if exc.status == 422 and not exc.of_job_file:
        return EXIT_USAGE
    return STATUS_EXITS.get(exc.status, EXIT_API)


def api() -> client.Api:
    return client.Api(config.current())


@app.command()
def login(
    url: Annotated[str, typer.Argument(help="The console, e.g. http://127.0.0.1:8000")],
    token: Annotated[str, typer.Option(help="An API token; asked for (hidden) when left out.")] = "",
) -> None:
    """Store the console's address and an API token (from its API tokens page) for later commands."""
    url = _console_url(url)
    client.refuse_plain_http(url)  # before a token is asked for, let alone sent
    if not token:
        err.print(f"Create a token at {url}/accounts/tokens/ and paste it here.")
        token = typer.prompt("API token", hide_input=True) if sys.stdin.isatty() else sys.stdin.readline()
    token = config.usable_token(token, source="the token given")
    if not token:  # an empty stdin (`e31 login URL < /dev/null`): the console would only answer 401
        raise typer.BadParameter(
            "no API token was given: pass --token, or paste one from the console's API tokens page",
            param_hint="'--token'",
        )
    login_ = config.Login(url=url, token=token)
    client.Api(login_).get("/jobs", limit=1)  # refused tokens stop here, before anything is stored
    path = config.save(login_)
    out.print(f"Logged in to {url}; token stored in {path} (readable by you only).")


def _console_url(url: str) -> str:
    """The console's address as the commands build on it: http(s)://host[:port][/prefix], without a trailing "/" or
    the API's own "/api/v1" (copied from the API docs, it made every request /api/v1/api/v1/…: 404)."""
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):  # requests said "No connection adapters were found", exit 7
        example = "https://" + url.split("://", 1)[-1]
        raise typer.BadParameter(
            f"{url!r}: the console's address starts with https:// (or http:// for a console on this machine), "
            f"e.g. {example}",
            param_hint="URL",
        )
    if not parts.hostname:
        raise typer.BadParameter(f"{url!r} names no host, e.g. https://console.example", param_hint="URL")
    try:
        parts.port  # noqa: B018 -- raises for a port that is no number or past 65535
    except ValueError as exc:
        raise typer.BadParameter(f"{url!r}: {exc}", param_hint="URL") from exc
    return url.rstrip("/").removesuffix("/api/v1").rstrip("/")


@app.command()
def submit(
    job_file: Annotated[
        Path | None, typer.Argument(exists=True, dir_okay=False, help="A TOML job file (or --from).")
    ] = None,
    from_job: Annotated[
        int | None, typer.Option("--from", min=1, help="Re-run this job of your team, as it was declared.")
    ] = None,
    wait: Annotated[
        bool,
        typer.Option(help="Wait for the end (an array's: every task's); exit with the job's exit code."),
    ] = False,
    follow: Annotated[bool, typer.Option(help="Print the log as it is written (implies --wait).")] = False,
    team: Annotated[str, typer.Option(help="Team slug, if you belong to several.")] = "",
    key: Annotated[str, typer.Option(help="Idempotency-Key (default: a new one per command).")] = "",
    notify: Annotated[
        str,
        typer.Option(help="E-mail you when this job ends: end, failure or never (over your team choice)."),
    ] = "",
) -> None:
    """Submit a job file, or re-run a job (--from ID). Retries after a dropped connection reuse its
    Idempotency-Key: never two jobs."""
    if (job_file is None) == (from_job is None):
        raise typer.BadParameter("give a job file or --from ID, one of them")
    if notify not in ("", "end", "failure", "never"):
        raise typer.BadParameter("--notify is end, failure or never")
    if key and not VALID_KEY.fullmatch(key):
        raise typer.BadParameter("--key is 1 to 255 printable ASCII characters, without spaces")
    key = key or f"e31-cli-{uuid.uuid4()}"
    session = api()
    headers = {"Idempotency-Key": key}
    try:
        if from_job is not None:
            job = session.post(f"/jobs/{from_job}/rerun", retry=True, headers=headers)
        else:
            job = session.post(
                "/jobs/file", retry=True, params={"team": team} if team else None, data=_job_file_body(job_file),
                headers={**headers, "Content-Type": "application/toml"},
            )  # fmt: skip
    except client.ApiError as exc:
        exc.of_job_file = True  # what the console refused is the declaration: exit 6 for a 422
        raise
    again = " (already submitted with this key)" if session.last_status == 200 else ""
    source = f" (re-run of {job['rerun_of']})" if job.get("rerun_of") else ""
    err.print(f"Submitted job {job['id']} {job['name']}{source}{again}: {job['state']}")
    if notify:
        _choose_email(session, job, notify)
    if array := job.get("array"):
        size = f"{array['size']} task{'s' * (array['size'] != 1)}"
        err.print(f"  array {array['id']}: {size} [{array['spec']}]; e31 ls --array {array['id']}")
    if not (wait or follow):
        # Alone on stdout, for JOB=$(e31 submit job.toml), and an array's id for A=$(e31 submit array.toml) and
        # `e31 cancel --array $A` (its first task's id named a job, or another array). A task run again on its own
        # is kept as a one-task array (``limit_of``: it counts against its array's limit), but it is one job.
        out.print(array["id"] if array and not array.get("limit_of") else job["id"])
    if job.get("budget_note"):
        err.print(job["budget_note"], style="yellow")
    if follow:
        _print_log(session, job["id"], follow=True)
    if (wait or follow) and job.get("array"):
        tasks = _wait_array(session, job["array"]["id"])
        raise typer.Exit(max(map(_exit_code, tasks)))
    if wait or follow:
        raise typer.Exit(_exit_code(_wait(session, job["id"])))


def _job_file_body(path: Path) -> bytes:
    """The job file as the console reads it: UTF-8 TOML, read as utf-8-sig, so without the byte-order mark Windows
    editors write (TOML has none: a console sent one read it as the file's first character and refused the file).
    Too large or not UTF-8, it is an invalid job file, said before anything is sent."""
    with path.open("rb") as handle:
        raw = handle.read(len(UTF8_BOM) + MAX_JOB_FILE_BYTES + 1)  # no more, of a 30 MB file given by mistake
    if len(raw.removeprefix(UTF8_BOM)) > MAX_JOB_FILE_BYTES:
        _invalid_job_file(
            f"{path}: a job file is at most {MAX_JOB_FILE_BYTES // 1024} KB (the console's limit)"
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = None
    if text is None or "\0" in text:  # UTF-16 without its mark decodes, NULs and all: no TOML file holds one
        hint = " (it looks like UTF-16)" if _looks_like_utf16(raw) else ""
        _invalid_job_file(f"{path} is not UTF-8 text{hint}: save it as UTF-8")
    return text.encode()


def _looks_like_utf16(raw: bytes) -> bool:
    """With its mark, or without: then text in the Latin alphabet has a NUL in every other byte."""
    head = raw[:200]
    return head[:2] in (b"\xff\xfe", b"\xfe\xff") or (
        len(head) > 1 and not (any(head[0::2]) and any(head[1::2]))
    )


def _invalid_job_file(message: str) -> NoReturn:
    err.print(message, style="red")
    raise typer.Exit(EXIT_INVALID)


def _choose_email(session: client.Api, job: dict, email: str) -> None:
    """The e-mail choice of the job, or of every task of its array, after they exist: refused, it is a warning,
    not a failed submit (a script that saw one would submit the job again)."""
    array = job.get("array")
    what, path = (f"array {array['id']}", f"/arrays/{array['id']}/email") if array else (
        f"job {job['id']}", f"/jobs/{job['id']}/email"
    )  # fmt: skip
    try:
        session.post(path, retry=True, json={"email": email})
    except (client.ApiError, requests.RequestException) as exc:
        err.print(
            f"Warning: {what}'s e-mail choice was not set: {exc}. The job runs; your team choice applies.",
            style="yellow",
        )


@app.command("ls")
def list_jobs(
    state: Annotated[str, typer.Option(help="A state, or alive / waiting / finished.")] = "",
    ended: Annotated[
        str, typer.Option(help="Only the jobs that ended this way: succeeded, failed, cancelled, timed_out…")
    ] = "",
    name: Annotated[str, typer.Option(help="Part of the name.")] = "",
    since: Annotated[str, typer.Option(help="Submitted since: 2h, 3d, 2026-11-30 or an ISO time.")] = "",
    until: Annotated[
        str,
        typer.Option(
            help="Submitted before an ISO time or 2h / 3d ago, or on or before a date (2026-11-30)."
        ),
    ] = "",
    team: Annotated[str, typer.Option(help="Team slug.")] = "",
    array: Annotated[int | None, typer.Option(help="Only the tasks of this array.", min=1)] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """List your team's jobs, newest first."""
    jobs = api().pages(
        "/jobs",
        limit=limit,
        state=state,
        ended=ended,
        name=name,
        team=team,
        since=_when(since),
        until=_when(until, through_the_day=True),
        array=array,
    )
    if as_json:
        for job in jobs:
            _print_json(job, indent=None)
        return
    jobs = list(jobs)
    # Several teams' jobs (a member of several, an operator) are told apart by their team's slug, as --team takes.
    teams = len({job.get("team_slug") for job in jobs}) > 1
    table = _table(
        "ID", "NAME", "TASK", "STATE", "END", "EXIT", "GPUS", "HOURS", "SUBMITTED (UTC)", *["TEAM"] * teams
    )
    for job in jobs:
        table.add_row(str(job["id"]), job["name"], _task(job), job.get("paused") or job["state"], job["end_reason"], _text(job["exit_code"]),
                      str(job["request"]["gpus"]), str(job["request"]["hours"]), _short_time(job["submitted_at"]),
                      *[job.get("team_slug", "")] * teams)  # fmt: skip
    out.print(table)


@app.command()
def show(
    job_id: int,
    as_json: Annotated[bool, typer.Option("--json", help="The API's JSON as it is.")] = False,
) -> None:
    """One job: its declaration, state, end and history."""
    job = api().get(f"/jobs/{job_id}")
    if as_json:
        _print_json(job, indent=2)
        return
    out.print(f"Job {job['id']} {job['name']} ({job['team']}): {job['state']}"
              + (f", {job['paused']}" if job.get("paused") else "")
              + (f", {job['end_reason']}" if job["end_reason"] else "")
              + (f", exit {job['exit_code']}" if job["exit_code"] is not None else ""))  # fmt: skip
    if job["end_detail"]:
        out.print(f"  {job['end_detail']}")
    if job.get("rerun_of"):
        out.print(f"  re-run of job {job['rerun_of']}")
    if job.get("array"):
        a = job["array"]
        limit = f"at most {a['max_running']} running at once" if a["max_running"] else ""
        if a.get("limit_of"):  # a task run again on its own
            out.print(f"  task {a['index']}, run again from array {a['limit_of']}"
                      + (f": counted among its {limit}" if limit else ""))  # fmt: skip
        else:
            out.print(f"  task {a['index']} of array {a['id']} [{a['spec']}], {a['size']} tasks"
                      + (f", {limit}" if limit else ""))  # fmt: skip
    if job["pending_reason"]:
        start = (
            f" (estimated start {_short_time(job['estimated_start'])} UTC)" if job["estimated_start"] else ""
        )
        out.print(f"  waiting: {job['pending_reason']}{start}")
    for key, how in (("after_ok", "succeed"), ("after_any", "end")):
        if job.get(key):
            out.print(f"  runs after job(s) {', '.join(map(str, job[key]))} {how}")
    if job.get("dependents"):
        out.print(f"  then: job(s) {', '.join(map(str, job['dependents']))}")
    out.print(f"  argv: {shlex.join(job['work']['argv'])}")  # where each argument begins and ends
    out.print(
        f"  request: {job['request']['gpus']} GPU(s) for {job['request']['hours']} h; output {job['output']['uri']}"
    )
    for event in job["events"]:
        out.print(f"  {_short_time(event['at'])} UTC  {event['state']:<10} {event['reason']}")


@app.command()
def logs(
    job_id: int,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the attempt ends.")
    ] = False,
    attempt: Annotated[int, typer.Option(help="Attempt number (default: the latest).")] = 0,
    rank: Annotated[int, typer.Option(help="Node rank of a multi-node job.")] = 0,
) -> None:
    """Print a job's log (the whole of it, up to the console's cap)."""
    if not _print_log(api(), job_id, follow=follow, attempt=attempt, rank=rank):
        raise typer.Exit(EXIT_NOT_FOUND)  # a script must not take a removed log for an empty one


@app.command()
def cancel(
    job_ids: Annotated[list[int] | None, typer.Argument(help="One or more job ids.")] = None,
    array: Annotated[list[int] | None, typer.Option(help="Cancel every live task of this array.")] = None,
) -> None:
    """Cancel jobs, or whole arrays; exits 0 only if every one was cancelled."""
    session, worst = api(), 0
    if not job_ids and not array:
        raise typer.BadParameter("name job ids, or --array ID")
    for array_id in array or []:
        try:
            body = session.post(f"/arrays/{array_id}/cancel")
            out.print(f"Array {array_id}: cancel requested ({_states(body['states'])})")
        except client.ApiError as exc:
            err.print(exc.detail)
            worst = max(worst, _exit_for(exc))
    for job_id in job_ids or []:
        try:
            job = session.post(f"/jobs/{job_id}/cancel")
            out.print(f"Job {job_id}: cancel requested ({job['state']})")
        except client.ApiError as exc:
            err.print(exc.detail)
            worst = max(worst, _exit_for(exc))
    raise typer.Exit(worst)


@app.command()
def outputs(
    job_id: int,
    download: Annotated[
        Path | None, typer.Option(help="Fetch every file into this folder.", file_okay=False)
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Replace files already in the folder that differ from the outputs."),
    ] = False,
) -> None:
    """List a job's sealed outputs (path, size, sha256), or download them."""
    session = api()
    summary = session.get(f"/jobs/{job_id}")["outputs"]
    sealed = summary["files"]
    if sealed and not summary.get(
        "files_listed", True
    ):  # an empty list would read as a job that wrote nothing
        err.print(
            f"The list of job {job_id}'s {sealed} file{'s' * (sealed != 1)} was removed with its log; the files stay "
            f"at {summary['delivered_to']}"
        )
        raise typer.Exit(EXIT_NOT_FOUND)
    files = list(session.pages(f"/jobs/{job_id}/outputs", limit=sealed))
    table = _table("PATH", "BYTES", "SHA256")
    for item in files:
        table.add_row(item["path"], str(item["bytes"]), item["sha256"][:16])
    if download is None:
        out.print(table)
        return
    targets = _targets(files, download)
    # Each file already there is read once: whether it differs decides both the refusal and what is skipped.
    there = {
        item["path"]: _differs(target, item)
        for item, target in targets
        if target.exists() or target.is_symlink()
    }
    if (differing := [path for path, differs in there.items() if differs]) and not force:
        err.print(
            f"Nothing was downloaded: {len(differing)} file{'s' * (len(differing) != 1)} already in {download} "
            f"differ{'s' * (len(differing) == 1)} from the job's outputs: {', '.join(differing)}. Use --force to "
            "replace them, or download into another folder.",
            style="red",
        )
        raise typer.Exit(EXIT_CONFLICT)
    not_saved = 0
    for item, target in targets:
        if there.get(item["path"]) is False:
            err.print(f"{item['path']}: already there, the same {item['bytes']} bytes")
            continue
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file of the folder stands where the output's folder goes
            problem = f"its folder cannot be made: {exc.strerror or exc}"
        else:
            problem = _download_checked(session, job_id, item, target)
        if problem:
            err.print(f"{item['path']}: not saved: {problem}", style="red")
            not_saved += 1
        else:
            err.print(f"{item['path']}: {item['bytes']} bytes")
    if not_saved:
        raise typer.Exit(EXIT_API)


LocalPath = PurePath  # how this machine reads a path: Windows splits on \\ and knows drives, POSIX does not


def _targets(files: list[dict], folder: Path) -> list[tuple[dict, Path]]:
    """Each listed file with where it is saved; one whose path would leave ``folder``, by the server's rules or
    this machine's (``..``, an absolute path, a drive, a separator of its own), is skipped, whatever the server
    says."""
    targets = []
    for item in files:
        parts = PurePosixPath(item["path"]).parts
        if not parts or not all(_one_name(part) for part in parts):
            err.print(f"{item['path']}: skipped, not a path inside the output folder")
            continue
        targets.append((item, folder.joinpath(*parts)))
    return targets


def _one_name(part: str) -> bool:
    local = LocalPath(part)
    return part not in ("/", ".", "..") and not local.anchor and not local.drive and local.parts == (part,)


def _differs(target: Path, item: dict) -> bool:
    """Whether something other than the listed file lies at ``target`` (which exists, or is a link)."""
    return not target.is_file() or target.is_symlink() or bool(_differs_from_listed(target, item))


def _download_checked(session: client.Api, job_id: int, item: dict, target: Path) -> str:
    """Downloads one listed file under a temporary name beside ``target``, renamed to it only when its size and
    sha256 are the listed ones: a cut transfer or another body (a proxy's page) never reads as the output.
    "" once saved, else what differed."""
    # A name of its own (never one an output or a file already there may have), removed only if it is left over.
    handle, name = tempfile.mkstemp(dir=target.parent, prefix=".e31-", suffix=".part")
    os.fchmod(
        handle, 0o666 & ~_umask()
    )  # mkstemp's 0600 would follow the file: saved as open() would save it
    os.close(handle)
    part = Path(name)
    try:
        session.download(f"/jobs/{job_id}/outputs/download", part, path=item["path"])
        problem = _differs_from_listed(part, item)
        if not problem:
            part.replace(target)
        return problem
    except (client.ApiError, requests.RequestException):
        err.print(f"{item['path']}: not saved, the download failed", style="red")
        raise
    finally:
        part.unlink(missing_ok=True)  # after the rename there is nothing left to remove


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _differs_from_listed(path: Path, item: dict) -> str:
    size = path.stat().st_size
    if size != item["bytes"]:
        return f"received {size} bytes, the console lists {item['bytes']}"
    with path.open("rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    if digest != item["sha256"]:
        return f"received sha256 {digest}, the console lists {item['sha256']}"
    return ""


@app.command()
def meter(job_id: int) -> None:
    """A job's meter rows (held GPU-time per hour) and its GPU-hours."""
    body = api().get(f"/jobs/{job_id}/meter")
    table = _table("PERIOD START (UTC)", "PERIOD END", "GPUS", "SECONDS", "KIND", "REASON")
    for e in body["entries"]:
        table.add_row(_short_time(e["period_start"]), _short_time(e["period_end"]), str(e["gpus"]),
                      f"{e['seconds']:.3f}", e["kind"], e["reason"])  # fmt: skip
    out.print(table)
    line = f"GPU-hours: {body['gpu_hours']:.4f} in the ledger"
    if body["holding"]:  # the open hour is not a ledger row until it closes
        line += (
            f"; {body['gpu_hours_so_far']:.4f} so far, still holding GPUs"
            f" ({body['open_gpu_hours']:.4f} in the open hour)"
        )
    out.print(line)


LEDGER_ROWS = 100_000  # rows `e31 ledger` reads at most (a thousand pages): the month's export holds them all


@app.command()
def ledger(
    month: Annotated[str, typer.Option(help="YYYY-MM (default: this month, UTC).")] = "",
    team: Annotated[str, typer.Option(help="Team slug.")] = "",
) -> None:
    """Your team's ledger rows for a month and its GPU-hours."""
    first = _month(month) if month else datetime.now(UTC).date().replace(day=1)
    last = first.replace(day=monthrange(first.year, first.month)[1])
    console = api()
    rows = list(
        console.pages(
            "/ledger", limit=LEDGER_ROWS + 1, start=first.isoformat(), end=last.isoformat(), team=team
        )
    )
    more = len(rows) > LEDGER_ROWS
    rows = rows[:LEDGER_ROWS]
    table = _table("JOB", "ARRAY", "PERIOD START (UTC)", "GPUS", "SECONDS", "KIND")
    for e in rows:
        table.add_row(str(e["job_id"]), _text(e.get("array_id")), _short_time(e["period_start"]), str(e["gpus"]),
                      f"{e['seconds']:.3f}", e["kind"])  # fmt: skip
    out.print(table)
    _print_array_totals(rows)
    gpu_hours = sum(e["gpus"] * e["microseconds"] for e in rows) / 3_600_000_000
    if not more:
        out.print(f"{first:%B %Y}: {len(rows)} rows, {gpu_hours:.4f} GPU-hours")
        return
    export = f"{console.console}/ledger/export.csv?start={first.isoformat()}&end={last.isoformat()}"
    out.print(
        f"{first:%B %Y}: the first {len(rows)} rows, {gpu_hours:.4f} GPU-hours; the month has more, which this "
        f"command does not read: its whole ledger is at {export}" + (f"&team={team}" if team else "")
    )


@app.command()
def queue(team: Annotated[str, typer.Option(help="Team slug.")] = "") -> None:
    """Your team's waiting jobs: when each should start and why it is not running yet."""
    waiting = list(api().pages("/jobs", limit=QUEUE_ROWS + 1, by_cursor=True, state="waiting", team=team))
    more = len(waiting) > QUEUE_ROWS
    waiting = waiting[:QUEUE_ROWS]
    waiting.sort(key=lambda j: (j["estimated_start"] is None, j["estimated_start"] or "", j["id"]))
    table = _table("ID", "NAME", "STATE", "GPUS", "ESTIMATED START (UTC)", "REASON")
    for job in waiting:
        table.add_row(str(job["id"]), job["name"], job["state"], str(job["request"]["gpus"]),
                      _short_time(job["estimated_start"]), job["pending_reason"])  # fmt: skip
    out.print(table if waiting else "No waiting jobs.")
    if more:  # read newest first: the oldest, often the soonest to start, are the ones left out
        err.print(f"Only the newest {QUEUE_ROWS:,} waiting jobs are shown: older ones wait too.")


def _print_log(session: client.Api, job_id: int, *, follow: bool, attempt: int = 0, rank: int = 0) -> bool:
    """Reads from offset 0 to the end: without ``follow`` until a read brings nothing new (the log so
    far), with it until the console says the attempt's log is complete. False if retention removed it."""
    offset = 0
    while True:
        read = functools.partial(
            session.get, f"/jobs/{job_id}/log", attempt=attempt or None, rank=rank, offset=offset,
            wait=LOG_WAIT_S if follow else 0, timeout_s=LOG_WAIT_S + 30,
        )  # fmt: skip
        chunk = _patiently(read) if follow else read()
        if chunk.get("removed"):  # retention removed it: say so on stderr, not an empty log on stdout
            err.print(chunk["removed"])
            return False
        if offset == 0 and chunk.get("ranks", 1) > 1:  # each node's part writes a log of its own
            others = ", ".join(f"--rank {r}" for r in range(chunk["ranks"]) if r != rank)
            err.print(f"The log of node rank {rank} of {chunk['ranks']}; the others': {others}")
        # Piped, the log as the job wrote it; on a terminal, nothing the job wrote drives the terminal.
        sys.stdout.write(_for_terminal(chunk["text"]) if _stdout_is_terminal() else chunk["text"])
        sys.stdout.flush()
        moved = chunk["next_offset"] != offset
        offset, attempt = chunk["next_offset"], chunk["attempt"]
        if chunk["complete"] or not (follow or moved):
            return True
        if chunk.get("retry_after_s"):  # the console is busy with other followers: ask again later
            time.sleep(chunk["retry_after_s"])


def _wait(session: client.Api, job_id: int) -> dict:
    """Polls until the job has ended and its outputs are no longer being delivered."""
    while True:
        job = _patiently(lambda: session.get(f"/jobs/{job_id}"))
        if _delivered(job):
            err.print(f"Job {job_id} {job['state']}: {job['end_reason']}"
                      + (f", exit {job['exit_code']}" if job["exit_code"] is not None else "")
                      + (", outputs not delivered" if job["delivery_state"] == "failed" else ""))  # fmt: skip
            return job
        time.sleep(WAIT_POLL_S)


def _patiently(read: Callable[[], _T]) -> _T:
    """``read()``, asked again with backoff while the console cannot be reached, for UNREACHABLE_PATIENCE_S from
    the first failure; said once on stderr, and again when it answers. For the reads that poll only: a request
    that changes state is never sent again this way, and what the console refused (a token, a job) is raised."""
    down_since = None
    backoffs = itertools.chain(UNREACHABLE_BACKOFF_S, itertools.repeat(UNREACHABLE_BACKOFF_S[-1]))
    while True:
        try:
            answer = read()
        except (requests.RequestException, client.ApiError) as exc:
            if not _unreachable(exc):
                raise
            now = time.monotonic()
            if down_since is None:
                down_since = now
                err.print(f"Cannot reach the console ({_why(exc)}): trying again for up to "
                          f"{UNREACHABLE_PATIENCE_S // 60} minutes.", style="yellow")  # fmt: skip
            left = down_since + UNREACHABLE_PATIENCE_S - now
            if left <= 0:
                raise
            time.sleep(min(next(backoffs), left))
        else:
            if down_since is not None:
                err.print("The console answers again.")
            return answer


def _unreachable(exc: Exception) -> bool:
    """What exits 7: no connection, no answer in time, a gateway's page or a throttle. A TLS failure is no
    restart (a certificate does not mend itself in five minutes)."""
    if isinstance(exc, client.ApiError):
        return _exit_for(exc) == EXIT_UNREACHABLE
    transient = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)
    return isinstance(exc, transient) and not isinstance(exc, requests.exceptions.SSLError)


def _why(exc: Exception) -> str:
    """A few words for the outage: "Connection refused", not urllib3's paragraph (the last error gives that)."""
    if isinstance(exc, client.ApiError):
        return f"error {exc.status}"
    if isinstance(exc, requests.Timeout):
        return "no answer in time"
    errno_text = re.search(r"\[Errno -?[0-9]+\] ([^'\")\]]+)", str(exc))
    return errno_text.group(1).strip() if errno_text else "the connection failed"


def _delivered(job: dict) -> bool:
    return job["state"] in TERMINAL and job["delivery_state"] != "delivering"


def _wait_array(session: client.Api, array_id: int) -> list[dict]:
    """Polls until every task of the array has ended and delivered its outputs, saying how many have as
    the count moves; then one line of how they ended, naming each task that did not succeed."""
    said = -1
    while True:
        array = _patiently(lambda: session.get(f"/arrays/{array_id}"))
        ended = sum(n for state, n in array["states"].items() if state in TERMINAL)
        if ended != said and ended < array["size"]:
            err.print(f"Array {array_id}: {ended} of {array['size']} tasks ended")
            said = ended
        if ended == array["size"]:
            tasks = _patiently(lambda: _array_tasks(session, array_id))
            if len(tasks) == array["size"] and all(map(_delivered, tasks)):
                err.print(f"Array {array_id}: {_array_outcome(tasks)}", soft_wrap=True)  # one line for logs
                return tasks
        time.sleep(WAIT_POLL_S)


def _array_tasks(session: client.Api, array_id: int) -> list[dict]:
    """The array's own tasks, each once. ``?array=`` also lists their re-runs (arrays of their own), newest first:
    a re-run is no answer for the task it ran again, and taking only the newest ``size`` of them could leave out
    a task that failed. A re-run submitted between two pages moves the rest down one: one seen twice."""
    tasks = {}
    for job in session.pages("/jobs", limit=10**9, by_cursor=True, array=array_id):
        if job["array"]["id"] == array_id:
            tasks[job["id"]] = job
    return list(tasks.values())


def _array_outcome(tasks: list[dict]) -> str:
    """How an array's tasks ended: "4 of 4 tasks ended: 2 succeeded, 2 failed; not succeeded: tasks 1
    (exit 3), 3 (exit 2)", each with the exit code --wait would give it."""
    outcomes = Counter(map(_outcome, tasks))
    in_order = sorted(outcomes.items(), key=lambda pair: (pair[0] != "succeeded", pair[0]))
    counts = ", ".join(f"{n} {outcome}" for outcome, n in in_order)
    not_ok = sorted((t for t in tasks if _exit_code(t)), key=lambda t: t["array"]["index"])
    named = ", ".join(f"{t['array']['index']} (exit {_exit_code(t)})" for t in not_ok)
    return f"{len(tasks)} of {len(tasks)} tasks ended: {counts}" + (
        f"; not succeeded: tasks {named}" if named else ""
    )


def _undelivered_success(job: dict) -> bool:
    """A success whose outputs could not be delivered: not a success (as dependencies count it)."""
    return job["end_reason"] == "succeeded" and job["delivery_state"] == "failed"


def _outcome(job: dict) -> str:
    """succeeded, failed, timed out, …, or delivery failed."""
    if _undelivered_success(job):
        return "delivery failed"
    return job["end_reason"].replace("_", " ")


def _exit_code(job: dict) -> int:
    """The job's own exit code when it ran and failed (a signal's as the shell gives it: 128 + N);
    otherwise the documented code of its end reason (a failed delivery is output_failed's)."""
    code = job["exit_code"]
    if job["end_reason"] == "failed":
        return 128 - code if code and code < 0 else code or 1
    if _undelivered_success(job):
        return END_REASON_EXITS["output_failed"]
    return END_REASON_EXITS.get(job["end_reason"], 1)


def _when(text: str, *, through_the_day: bool = False) -> str:
    """2h / 3d / 45m ago, or a date or ISO time, as the ISO time the API takes; a date ``through_the_day`` as the
    next day's start, so that `--until 2026-11-30`, like the jobs page's "to", takes in that day's jobs."""
    if not text:
        return ""
    units = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
    if text[-1:] in units and re.fullmatch(r"[0-9]+", text[:-1]):
        return (datetime.now(UTC) - timedelta(**{units[text[-1]]: int(text[:-1])})).isoformat()
    try:
        if len(text) == 10:
            day = date.fromisoformat(text) + timedelta(days=int(through_the_day))
            return day.isoformat() + "T00:00:00+00:00"
        return datetime.fromisoformat(text).isoformat()
    except (ValueError, OverflowError) as exc:
        raise typer.BadParameter(f"{text!r}: use 2h, 3d, 2026-11-30 or an ISO time") from exc


def _month(text: str) -> date:
    """The first day of a YYYY-MM month."""
    try:
        return datetime.strptime(text, "%Y-%m").date()
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r}: use YYYY-MM, e.g. 2026-11", param_hint="--month") from exc


def _print_array_totals(rows: list[dict]) -> None:
    """The ledger groups an array's tasks: one GPU-hours line per array."""
    arrays: dict[int, float] = {}
    for e in rows:
        if e.get("array_id"):
            arrays[e["array_id"]] = (
                arrays.get(e["array_id"], 0) + e["gpus"] * e["microseconds"] / 3_600_000_000
            )
    for array_id, gpu_hours in sorted(arrays.items()):
        out.print(f"array {array_id}: {gpu_hours:.4f} GPU-hours")


def _task(job: dict) -> str:
    return f"{job['array']['id']}[{job['array']['index']}]" if job.get("array") else ""


def _states(states: dict[str, int]) -> str:
    return ", ".join(f"{n} {state}" for state, n in sorted(states.items()))


def _table(*columns: str) -> Table:
    table = _ScreenTable(box=None, pad_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def _short_time(value: str | None) -> str:
    """An API time in UTC to the second ("2026-05-04 14:20:00"), whatever offset the console wrote it with."""
    return datetime.fromisoformat(value).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if value else ""


def _text(value) -> str:
    return "" if value is None else str(value)
