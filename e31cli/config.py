"""Where ``e31`` finds the console: $E31_URL and $E31_TOKEN first (CI, scripts), then the stored login.

The login is a JSON file in $XDG_CONFIG_HOME/e31 (~/.config/e31), readable by its owner only (0600).
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit


class NotLoggedIn(Exception):
    pass


@dataclass(frozen=True)
class Login:
    url: str
    token: str


def login_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "e31" / "login.json"


def save(login: Login) -> Path:
    path = login_file()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Created 0600 from the start (never briefly world-readable), and tightened if it already existed.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"url": login.url, "token": login.token}, handle)
    return path


def current() -> Login:
    stored = _stored()
    url = (os.environ.get("E31_URL") or stored.get("url", "")).rstrip("/")
    # Stripped as `e31 login` strips what it stores: `echo` and secrets files end the token with a newline.
    from_env = os.environ.get("E31_TOKEN", "").strip()
    token = from_env or stored.get("token", "")
    if not url or not token:
        raise NotLoggedIn("Not logged in: run `e31 login URL` (or set E31_URL and E31_TOKEN).")
    if not from_env and _console(url) != _console(stored["url"]):
        # The stored token is for the console it was stored with, never whatever $E31_URL names.
        raise NotLoggedIn(
            f"$E31_URL names {_console(url)}, but the stored login is for {_console(stored['url'])}: set "
            f"E31_TOKEN to a token of {_console(url)}, or run `e31 login {url}`."
        )
    source = "$E31_TOKEN" if from_env else str(login_file())
    return Login(url=url, token=usable_token(token, source=source))


def _stored() -> dict:
    path = login_file()
    if not path.exists():
        return {}
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise NotLoggedIn(
            f"The stored login {path} cannot be read ({exc}): run `e31 login URL` again."
        ) from exc
    if not isinstance(stored, dict) or not isinstance(stored.get("url"), str):
        raise NotLoggedIn(f"The stored login {path} is not one `e31 login` wrote: run `e31 login URL` again.")
    return stored


def _console(url: str) -> str:
    """scheme://host:port/prefix, with the scheme's own port written out and no trailing "/", so two spellings of
    one console compare equal, and two consoles served under different prefixes of one host do not."""
    parts = urlsplit(url.strip())
    try:
        port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
    except ValueError:  # no port number: no console either, and the request says so
        return url
    return f"{parts.scheme}://{parts.hostname}:{port}{parts.path.rstrip('/')}"


def usable_token(token: str, *, source: str) -> str:
    """The token without the whitespace around it; NotLoggedIn if what is left could not be sent in a header.
    The message never repeats the token: it is a secret, and a newline in it would be one more header."""
    token = token.strip()
    if not (token.isascii() and token.isprintable()):
        raise NotLoggedIn(
            f"The API token in {source} holds a character no token has (a control character or non-ASCII): "
            "copy it again from the console's API tokens page."
        )
    return token
