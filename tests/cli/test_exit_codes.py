"""What `e31` (main.run, the installed entry point) says and exits with when the console's answer, the command
line or the login (its address, its token) is wrong: one line and a documented exit code, never a traceback, and
never the token."""

import io
import json
import sys

import pytest
import requests

from e31cli import main
from tests.cli.inprocess import e31, use_console


def run_e31(monkeypatch, capsys, answer, *args: str) -> tuple[int, str]:
    """(exit code, stderr) of ``e31 ARGS`` whose every request is answered by ``answer``."""
    monkeypatch.setenv("E31_URL", "https://console.test")
    monkeypatch.setenv("E31_TOKEN", "e31_x")
    monkeypatch.setattr(requests.Session, "request", lambda self, method, url, **kw: answer(url))
    monkeypatch.setattr(sys, "argv", ["e31", *args])
    with pytest.raises(SystemExit) as exit_:
        main.run()
    return exit_.value.code, capsys.readouterr().err


def answer(url, status: int, content_type: str, body: bytes, **headers: str) -> requests.Response:
    """A response as requests hands it over: ``status``, ``body`` of ``content_type``, and any other headers."""
    response = requests.Response()
    response.status_code, response.url = status, url
    response.headers.update({"Content-Type": content_type, **headers})
    response.raw = io.BytesIO(body)
    return response


def test_a_read_timeout_exits_as_an_unreachable_console_with_one_line(monkeypatch, capsys):
    def slow(url):
        raise requests.ReadTimeout("Read timed out. (read timeout=30)")

    code, stderr = run_e31(monkeypatch, capsys, slow, "show", "1")
    assert code == main.EXIT_UNREACHABLE
    assert stderr == "The console did not answer in time: Read timed out. (read timeout=30)\n"


def test_a_success_whose_body_is_not_json_is_an_api_error_with_one_line(monkeypatch, capsys):
    def proxy_page(url):  # a proxy's or load balancer's page, answered 200 in front of the console
        return answer(url, 200, "text/html", b"<html><body>Please log in</body></html>")

    code, stderr = run_e31(monkeypatch, capsys, proxy_page, "show", "1")
    assert code == main.EXIT_API
    assert stderr == "Error 200: the console's answer is not JSON (text/html)\n"


def test_a_console_still_throttling_after_the_retries_exits_as_unreachable_not_as_a_failed_job(
    monkeypatch, capsys
):
    def throttled(url):
        return answer(
            url, 429, "application/json", b'{"detail": "Too many requests."}', **{"Retry-After": "1"}
        )

    code, stderr = run_e31(monkeypatch, capsys, throttled, "show", "1")
    assert code == main.EXIT_UNREACHABLE
    assert stderr == "Error 429: Too many requests.\n"


def test_a_malformed_ledger_month_is_a_command_line_error(monkeypatch):
    code, stdout, stderr = e31(monkeypatch, "e31_x", "ledger", "--month", "2024-13")
    assert code == 2, (code, stdout, stderr)
    assert "'2024-13': use YYYY-MM" in stderr


def answered_by_adapter(monkeypatch, status: int, body: dict) -> list[requests.PreparedRequest]:
    """The requests the CLI sends, each answered ``status`` with ``body`` and none leaving this machine. The
    adapter is replaced, not ``Session.request``: requests still checks the headers as it prepares them."""
    sent: list[requests.PreparedRequest] = []

    def send(self, request, **kwargs):
        sent.append(request)
        response = answer(request.url, status, "application/json", json.dumps(body).encode())
        response.request = request
        return response

    monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", send)
    return sent


def exit_of(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """(exit code, stderr) of ``e31 ARGS`` run as the installed command runs it, exceptions turned into codes."""
    monkeypatch.setattr(sys, "argv", ["e31", *args])
    with pytest.raises(SystemExit) as exit_:
        main.run()
    return exit_.value.code, capsys.readouterr().err


NO_JOBS = {"items": [], "count": 0}


@pytest.fixture
def no_stored_login(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("E31_URL", raising=False)
    monkeypatch.delenv("E31_TOKEN", raising=False)
    monkeypatch.delenv("E31_ALLOW_PLAIN_HTTP", raising=False)
    return tmp_path


def test_login_to_a_plain_http_console_on_another_machine_is_refused_before_the_token_is_sent(
    monkeypatch, capsys, no_stored_login
):
    """`e31 login http://console.example` sent the token in clear text over the network to check it."""
    sent = answered_by_adapter(monkeypatch, 200, NO_JOBS)
    code, stderr = exit_of(monkeypatch, capsys, "login", "http://console.example", "--token", "e31_x")
    assert (code, sent) == (2, []), stderr
    assert "https://" in stderr and "E31_ALLOW_PLAIN_HTTP=1" in stderr, stderr
    assert not list(no_stored_login.rglob("login.json"))


def test_a_plain_http_console_in_e31_url_on_another_machine_is_refused_before_anything_is_sent(
    monkeypatch, capsys, no_stored_login
):
    sent = answered_by_adapter(monkeypatch, 200, NO_JOBS)
    monkeypatch.setenv("E31_URL", "http://10.0.0.5")
    monkeypatch.setenv("E31_TOKEN", "e31_x")
    code, stderr = exit_of(monkeypatch, capsys, "ls")
    assert (code, sent) == (2, []), stderr
    assert "E31_ALLOW_PLAIN_HTTP=1" in stderr, stderr


@pytest.mark.parametrize(
    "url, allow",
    [
        ("http://127.0.0.1:8000", ""),
        ("http://127.4.5.6", ""),
        ("http://[::1]:8000", ""),
        ("http://localhost:8000", ""),
        ("https://console.example", ""),
        ("http://10.0.0.5", "1"),  # a lab that chose plain HTTP, and said so
    ],
)
def test_a_console_on_this_machine_over_tls_or_allowed_plain_is_still_asked(
    monkeypatch, capsys, no_stored_login, url, allow
):
    sent = answered_by_adapter(monkeypatch, 200, NO_JOBS)
    monkeypatch.setenv("E31_URL", url)
    monkeypatch.setenv("E31_TOKEN", "e31_x")
    monkeypatch.setenv("E31_ALLOW_PLAIN_HTTP", allow)
    code, stderr = exit_of(monkeypatch, capsys, "ls")
    assert code == 0, stderr
    assert [r.url.startswith(f"{url}/api/v1/jobs?") for r in sent] == [True], [r.url for r in sent]


TOKEN = "e31_Zq7TokenNeverShown"


@pytest.mark.parametrize("token", [f"{TOKEN}\n", f" {TOKEN}", f"{TOKEN}\r", f"{TOKEN}\n{TOKEN}"])
def test_a_token_with_a_newline_or_space_is_never_printed_and_exits_as_not_logged_in(
    monkeypatch, capsys, no_stored_login, token
):
    """A newline in $E31_TOKEN (from `echo` or a secrets file) made requests refuse the header with a message
    holding the token, which the CLI printed as "Cannot reach the console: ..." and exited 7."""
    sent = answered_by_adapter(
        monkeypatch, 401, {"detail": "Invalid token."}
    )  # what the console says of TOKEN
    monkeypatch.setenv("E31_URL", "https://console.example")
    monkeypatch.setenv("E31_TOKEN", token)
    code, stderr = exit_of(monkeypatch, capsys, "ls")
    assert TOKEN not in stderr
    assert code == main.EXIT_AUTH, stderr
    # Whitespace around the token is stripped, as `e31 login` strips it; one inside it is never sent.
    assert {r.headers["Authorization"] for r in sent} <= {f"Bearer {TOKEN}"}


def test_login_with_a_token_holding_a_newline_sends_nothing_and_never_prints_it(
    monkeypatch, capsys, no_stored_login
):
    sent = answered_by_adapter(monkeypatch, 200, NO_JOBS)
    code, stderr = exit_of(monkeypatch, capsys, "login", "https://console.example", "--token", f"{TOKEN}\nx")
    assert (code, sent) == (main.EXIT_AUTH, []), stderr
    assert TOKEN not in stderr
    assert not list(no_stored_login.rglob("login.json"))


def test_a_header_requests_refuses_is_never_quoted(monkeypatch, capsys, no_stored_login):
    """requests' InvalidHeader quotes the header's value: "Cannot reach the console: {exc}" printed the token."""

    def refuse(self, request, **kwargs):
        raise requests.exceptions.InvalidHeader(f"Invalid return character in header value: 'Bearer {TOKEN}'")

    monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", refuse)
    monkeypatch.setenv("E31_URL", "https://console.example")
    monkeypatch.setenv("E31_TOKEN", TOKEN)
    code, stderr = exit_of(monkeypatch, capsys, "ls")
    assert TOKEN not in stderr
    assert code == main.EXIT_USAGE, stderr


@pytest.mark.parametrize("status", [502, 503, 504])
def test_a_gateway_still_failing_after_the_retries_exits_as_unreachable_not_as_a_failed_job(
    monkeypatch, capsys, status
):
    """A console restarting behind its load balancer: exit 1 under --wait reads as "the job failed"."""

    def gateway(url):
        return answer(url, status, "text/html", b"<html>503 Service Temporarily Unavailable</html>")

    code, _ = run_e31(monkeypatch, capsys, gateway, "show", "1")
    assert code == main.EXIT_UNREACHABLE


def test_an_idempotency_key_http_cannot_carry_is_a_usage_error_not_a_traceback(monkeypatch, capsys, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('name = "x"\n')
    code, stderr = run_e31(monkeypatch, capsys, lambda url: None, "submit", str(job), "--key", "ключ")
    assert code == main.EXIT_USAGE
    assert "--key" in stderr and "Traceback" not in stderr


def test_the_consoles_own_503_keeps_exit_1(monkeypatch, capsys):
    """It cannot read an output's store: a lasting state a retrying script would loop on, not a restart."""

    def cannot_read(url):
        return answer(
            url, 503, "application/json", b'{"detail": "the console cannot read this output (no s3 support)"}'
        )

    code, stderr = run_e31(monkeypatch, capsys, cannot_read, "show", "1")
    assert code == main.EXIT_API and "cannot read this output" in stderr


@pytest.mark.django_db
@pytest.mark.parametrize(
    "args, said",
    [
        (["ls", "--state", "runnning"], "state"),
        (["logs", "1", "--attempt", "-1"], "attempt"),
    ],
)
def test_an_argument_the_console_refuses_is_a_command_line_error_not_an_invalid_job_file(
    monkeypatch, capsys, member_token, args, said
):
    """Every 422 exited 6, "the job file is not valid", from commands that send no job file."""
    use_console(monkeypatch, member_token)
    code, stderr = exit_of(monkeypatch, capsys, *args)
    assert code == main.EXIT_USAGE, stderr
    assert "Error 422" in stderr and said in stderr, stderr


@pytest.mark.django_db
def test_a_job_file_the_console_refuses_is_still_an_invalid_job_file(
    monkeypatch, capsys, member_token, tmp_path
):
    job_file = tmp_path / "train.toml"
    job_file.write_text('name = "train"\n[request]\ngpus = "many"\n')
    use_console(monkeypatch, member_token)
    code, stderr = exit_of(monkeypatch, capsys, "submit", str(job_file))
    assert code == main.EXIT_INVALID, stderr
    assert "Error 422" in stderr and "request.gpus" in stderr, stderr
