"""A thin client of the console's /api/v1: errors become ApiError with the server's own explanation."""

import ipaddress
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from e31cli import config

# Worth retrying: the request may not have reached the console, it was briefly unable to answer, or
# it throttled this token (429: many `--wait` polls of one CI token together pass E31_API_RATE).
RETRY_STATUSES = {429, 502, 503, 504}
RETRIES = 3
# The console's Retry-After is waited, up to this: a longer wait looks like a hung command.
RETRY_AFTER_MAX_S = 30.0


class _Retry(Retry):
    """urllib3's Retry, with Retry-After capped, and read as the console may send it ("0.4" too)."""

    def parse_retry_after(self, retry_after: str) -> float:
        return retry_after_s(retry_after)


# Reads are idempotent, so urllib3 retries them itself: a connection reset as it was reused (the
# console closed a kept-alive connection just then, as during a long `--follow`) or a 429/502/503/504.
# Any method is retried only when the connection never opened; ``other=0``, since urllib3 retries
# "other" errors (TLS failures once the request may be sent) whatever the method.
READ_RETRY = _Retry(
    total=RETRIES, other=0, backoff_factor=0.5, status_forcelist=RETRY_STATUSES,
    allowed_methods=frozenset({"GET"}), raise_on_status=False, respect_retry_after_header=True,
)  # fmt: skip


def retry_after_s(header: str | None) -> float:
    """Seconds a Retry-After asks for, at most RETRY_AFTER_MAX_S; 0 when absent or not a number (an
    HTTP date included: the console sends seconds), so the usual backoff applies."""
    if not header or not re.fullmatch(r"\s*[0-9]+(\.[0-9]+)?\s*", header):
        return 0.0
    return min(float(header), RETRY_AFTER_MAX_S)


@dataclass
class ApiError(Exception):
    status: int
    detail: str
    errors: list[dict] = field(default_factory=list)
    retry_after_s: float = 0.0
    from_console: bool = True  # the console's own JSON answer, not a gateway's or proxy's page in front of it
    # An answer to a submitted declaration (a job file, a re-run's): its 422 is an invalid job file, another
    # command's 422 a refused filter or argument.
    of_job_file: bool = False

    def __str__(self) -> str:
        lines = [self.detail] + [f"  {e.get('field') or '(job)'}: {e.get('message')}" for e in self.errors]
        return "\n".join(lines)


class PlainHttpRefused(Exception):
    """The console's address is plain http:// to another machine: the token would cross the network readable."""


ALLOW_PLAIN_HTTP = "E31_ALLOW_PLAIN_HTTP"
LOOPBACK_NAMES = {"localhost", "localhost."}


def refuse_plain_http(url: str) -> None:
    """Raises PlainHttpRefused for an http:// URL whose host is not this machine's loopback, unless the
    environment opts out (a lab without TLS). Checked before any request, so the token is never sent."""
    parts = urlsplit(url)
    if (
        parts.scheme != "http"
        or _is_loopback(parts.hostname or "")
        or os.environ.get(ALLOW_PLAIN_HTTP) == "1"
    ):
        return
    raise PlainHttpRefused(
        f"Refusing to send the API token in clear text to {url}: use the console's https:// address "
        f"(plain http:// is accepted only on this machine: 127.0.0.1, ::1, localhost). "
        f"In a lab without TLS, set {ALLOW_PLAIN_HTTP}=1 to allow it."
    )


def _is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: only "localhost" is known not to leave the machine
        return False


class ConsoleSession(requests.Session):
    """Follows a redirect only within the console's own address: the same host, and the same scheme and port or
    http:// upgraded to https://. Another host's answer would be shown as the console's (requests drops the token
    there, but follows): the command ends with an ApiError naming where the redirect pointed."""

    def get_redirect_target(self, resp: requests.Response) -> str | None:
        target = super().get_redirect_target(resp)
        if target is not None and not _same_console(resp.url, urljoin(resp.url, target)):
            raise ApiError(
                resp.status_code,
                f"the console redirected to {urljoin(resp.url, target)}, another address: not followed. If the "
                "console has moved there, sign in to it again with `e31 login`",
                from_console=False,
            )
        return target


def _same_console(old: str, new: str) -> bool:
    was, now = urlsplit(old), urlsplit(new)
    if (was.hostname or "").lower() != (now.hostname or "").lower():
        return False
    same_origin = (was.scheme, was.port) == (now.scheme, now.port)
    upgraded = was.scheme == "http" and now.scheme == "https" and now.port is None
    return same_origin or upgraded


class Api:
    def __init__(self, login: config.Login, *, timeout_s: float = 30) -> None:
        refuse_plain_http(login.url)
        self.console = login.url  # the console's own pages, for what the API does not hold
        self.base = f"{login.url}/api/v1"
        self.timeout_s = timeout_s
        self.session = ConsoleSession()
        # Plain http:// is allowed to this machine because it never leaves it: no proxy from the environment
        # (HTTP_PROXY) may carry the token elsewhere, readable. (Over https:// a proxy only tunnels, and the
        # environment may name the CA of a console's private certificate: kept.)
        parts = urlsplit(login.url)
        self.session.trust_env = not (parts.scheme == "http" and _is_loopback(parts.hostname or ""))
        for scheme in ("http://", "https://"):
            self.session.mount(scheme, HTTPAdapter(max_retries=READ_RETRY))
        self.session.headers.update({"Authorization": f"Bearer {login.token}", "User-Agent": "e31-cli"})

    def get(self, path: str, *, timeout_s: float | None = None, **params: Any) -> Any:
        query = {k: v for k, v in params.items() if v not in (None, "")}
        return self._call("GET", path, params=query, timeout=timeout_s or self.timeout_s)

    def post(self, path: str, *, retry: bool = False, **kwargs: Any) -> Any:
        """POST; with ``retry`` (idempotent calls only: an Idempotency-Key is set) transient failures are retried."""
        attempts = RETRIES if retry else 1
        for attempt in range(attempts):
            try:
                return self._call("POST", path, timeout=self.timeout_s, **kwargs)
            except (requests.ConnectionError, requests.Timeout, ApiError) as exc:
                transient = not isinstance(exc, ApiError) or exc.status in RETRY_STATUSES
                if not transient or attempt == attempts - 1:
                    raise
                time.sleep(max(2**attempt, getattr(exc, "retry_after_s", 0)))
        raise AssertionError("unreachable")

    def pages(self, path: str, *, limit: int, by_cursor: bool = False, **params: Any) -> Iterator[dict]:
        """Items of a paged list, page by page, up to ``limit`` of them. ``by_cursor`` (the job list): each page
        after the last item of the one before (``before``), so a list changing meanwhile skips nothing."""
        read, offset = 0, 0
        while read < limit:
            asked = min(100, limit - read)
            page = self.get(path, limit=asked, offset=offset, **params)
            items = page["items"]
            yield from items
            read += len(items)
            if by_cursor:
                if len(items) < asked:
                    return
                params["before"] = items[-1]["id"]
            else:
                offset = read
                if not items or (read >= page["count"] and not page.get("count_capped")):
                    return

    def download(self, api_path: str, destination, **params: Any) -> int:
        with self.session.get(
            f"{self.base}{api_path}", params=params, stream=True, timeout=self.timeout_s
        ) as r:
            _raise_for(r)
            written = 0
            with open(destination, "wb") as out:
                for block in r.iter_content(1 << 20):
                    out.write(block)
                    written += len(block)
            return written

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.session.request(method, f"{self.base}{path}", **kwargs)
        _raise_for(response)
        self.last_status = response.status_code
        try:
            return response.json()
        except ValueError as exc:  # a proxy's or load balancer's page in front of the console
            kind = response.headers.get("Content-Type") or "no content type"
            raise ApiError(response.status_code, f"the console's answer is not JSON ({kind})") from exc


def _raise_for(response: requests.Response) -> None:
    if response.status_code < 400:
        return
    from_console = True
    try:
        body = response.json()
    except ValueError:
        body, from_console = {"detail": response.text[:300] or response.reason}, False
    if not isinstance(body, dict):
        body, from_console = {"detail": response.reason}, False
    raise ApiError(
        response.status_code,
        str(body.get("detail", response.reason)),
        body.get("errors") or [],
        retry_after_s(response.headers.get("Retry-After")),
        from_console,
    )
