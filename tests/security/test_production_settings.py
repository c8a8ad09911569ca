"""E31_PRODUCTION: `check --deploy` is clean, HTTPS is enforced and secrets come from the environment or files.

Settings are read once at start-up, so each check runs a fresh Python process with production values.
"""

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import django, json
django.setup()
from django.conf import settings
from django.test import Client
c = Client()
plain, health = c.get("/accounts/login/"), c.get("/healthz")
page = c.get("/accounts/login/", secure=True)
cookie = page.cookies["csrftoken"]
print(json.dumps({
    "plain": [plain.status_code, plain.get("Location", "")], "health": health.status_code,
    "hsts": page.get("Strict-Transport-Security"), "csp": page.get("Content-Security-Policy"),
    "csrf_cookie": {"secure": bool(cookie["secure"]), "httponly": bool(cookie["httponly"])},
    "session": [settings.SESSION_COOKIE_SECURE, settings.SESSION_COOKIE_HTTPONLY, settings.SESSION_COOKIE_AGE,
                settings.SESSION_EXPIRE_AT_BROWSER_CLOSE],
    "secret_key": settings.SECRET_KEY, "database": settings.DATABASES["default"]["NAME"],
}))
"""


@pytest.fixture
def production_env(tmp_path) -> dict[str, str]:
    key_file = tmp_path / "secret_key"
    key_file.write_text(secrets.token_urlsafe(50) + "\n")
    db_file = tmp_path / "database_url"
    db_file.write_text(f"sqlite:///{tmp_path / 'prod.sqlite3'}\n")
    secrets_keys = tmp_path / "secrets_keys"
    secrets_keys.write_text(Fernet.generate_key().decode() + "\n")
    # Nothing of the test run leaks in (the browser tests set DJANGO_ALLOW_ASYNC_UNSAFE, which check --deploy refuses).
    dev_only = ("E31_", "DATABASE_URL", "SECRET_KEY", "DJANGO_ALLOW_ASYNC_UNSAFE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dev_only)}
    return {
        **env, "DJANGO_SETTINGS_MODULE": "e31web.settings", "E31_PRODUCTION": "1",
        "SECRET_KEY_FILE": str(key_file), "DATABASE_URL_FILE": str(db_file),
        "E31_SECRETS_KEYS_FILE": str(secrets_keys),
        "E31_ALLOWED_HOSTS": "console.e31.example,testserver", "E31_STATE_DIR": str(tmp_path / "state"),
        "E31_CONSOLE_URL": "https://console.e31.example",
    }  # fmt: skip


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_check_deploy_finds_nothing_to_warn_about_with_production_values(production_env):
    done = _run(production_env, "manage.py", "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


def test_production_redirects_to_https_sends_hsts_and_keeps_cookies_secure(production_env, tmp_path):
    done = _run(production_env, "-c", PROBE)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["plain"] == [301, "https://testserver/accounts/login/"]
    assert seen["health"] == 200  # the load balancer's probe is served over plain HTTP
    assert seen["hsts"] == "max-age=31536000; includeSubDomains; preload"
    assert "default-src 'self'" in seen["csp"]
    assert seen["csrf_cookie"] == {"secure": True, "httponly": True}
    assert seen["session"] == [True, True, 12 * 3600, True]
    assert seen["secret_key"] == (tmp_path / "secret_key").read_text().strip()  # read from SECRET_KEY_FILE
    assert seen["database"] == str(tmp_path / "prod.sqlite3")  # read from DATABASE_URL_FILE


def test_production_refuses_to_start_without_a_secret_key_or_with_debug_on(production_env):
    without_key = {k: v for k, v in production_env.items() if k != "SECRET_KEY_FILE"}
    done = _run(without_key, "manage.py", "check")
    assert done.returncode != 0
    assert "ImproperlyConfigured: SECRET_KEY (or SECRET_KEY_FILE) must be set in production\n" in done.stderr
    done = _run({**production_env, "E31_DEBUG": "1"}, "manage.py", "check")
    assert done.returncode != 0
    assert "ImproperlyConfigured: E31_DEBUG must be off when E31_PRODUCTION is set\n" in done.stderr


def test_production_refuses_to_start_without_a_key_of_its_own_for_team_secrets(production_env):
    production_env.pop("E31_SECRETS_KEYS_FILE")
    done = _run(production_env, "manage.py", "check")
    assert done.returncode != 0 and "E31_SECRETS_KEYS" in done.stderr


@pytest.mark.parametrize("url", [None, "http://console.e31.example"])
def test_production_refuses_to_start_without_the_consoles_https_address_for_e_mailed_links(
    production_env, url
):
    production_env.pop("E31_CONSOLE_URL")
    if url:
        production_env["E31_CONSOLE_URL"] = url
    done = _run(production_env, "manage.py", "check")
    assert done.returncode != 0 and "E31_CONSOLE_URL must be the console's https:// address" in done.stderr
