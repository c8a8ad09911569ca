"""Sign-in lockout: ten failures for one username from one client address in the window, then 429."""

import logging
import time

import pytest
from django.urls import reverse

from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db
LOGIN = reverse("accounts:login")


def _post(client, username: str, password: str, addr: str = "203.0.113.7"):
    return client.post(LOGIN, {"username": username, "password": password}, REMOTE_ADDR=addr)


@pytest.fixture(autouse=True)
def _limits_and_a_fast_hasher(settings):
    settings.E31_LOGIN_FAILURE_LIMIT = 10
    settings.E31_LOGIN_WINDOW_S = 900
    # Dozens of sign-ins per test: a deliberately slow hasher would be most of the run time.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def test_the_eleventh_failure_in_the_window_is_refused_even_with_the_right_password(client, member):
    statuses = [_post(client, "alice", "wrong").status_code for _ in range(10)]
    assert statuses == [200] * 10  # the form again, with its error
    refused = _post(client, "alice", PASSWORD)
    assert refused.status_code == 429 and refused["Retry-After"] == "900"
    assert "_auth_user_id" not in client.session


def test_the_limit_is_per_username_and_address(client, member, outsider):
    for _ in range(10):
        _post(client, "alice", "wrong")
    assert _post(client, "bob", PASSWORD).status_code == 302  # another username, same address
    elsewhere = _post(client, "alice", PASSWORD, addr="198.51.100.9")  # same username, another address
    assert elsewhere.status_code == 302


def test_the_username_is_counted_whatever_its_case_or_spacing(client, member):
    for name in ("alice", "ALICE", " Alice ") * 4:
        _post(client, name, "wrong")
    assert _post(client, "alice", PASSWORD).status_code == 429


def test_the_account_is_counted_whether_named_by_its_username_or_its_e_mail(client, member):
    """Sign-in takes an account's e-mail address too: alternating the two names must not double the tries."""
    member.email = "Alice@Example.org"
    member.save(update_fields=["email"])
    for name in ("alice", "alice@example.org") * 5:
        assert _post(client, name, "wrong").status_code == 200
    assert _post(client, "ALICE@example.org", PASSWORD).status_code == 429
    assert _post(client, "alice", PASSWORD).status_code == 429


def test_a_successful_sign_in_clears_the_failures(client, member):
    for _ in range(9):
        _post(client, "alice", "wrong")
    assert _post(client, "alice", PASSWORD).status_code == 302
    client.logout()
    for _ in range(9):
        assert _post(client, "alice", "wrong").status_code == 200
    assert _post(client, "alice", PASSWORD).status_code == 302


def test_a_refused_sign_in_is_logged_as_a_denial(client, member, caplog):
    caplog.set_level(logging.WARNING, logger="e31.denials")
    for _ in range(11):
        _post(client, "alice", "wrong")
    assert [(r.status, r.path) for r in caplog.records if r.name == "e31.denials"] == [(429, LOGIN)]


PROXY = "10.0.0.2"  # the load balancer: every request arrives from it


def _via_proxy(client, username: str, password: str, *, client_addr: str):
    return client.post(
        LOGIN,
        {"username": username, "password": password},
        REMOTE_ADDR=PROXY,
        HTTP_X_FORWARDED_FOR=client_addr,
    )


def test_behind_a_trusted_proxy_an_attack_does_not_lock_the_operator_out_from_elsewhere(
    client, operator, settings
):
    settings.E31_TRUSTED_PROXIES = [PROXY]
    for _ in range(12):
        _via_proxy(client, "olga", "wrong", client_addr="203.0.113.7")
    assert _via_proxy(client, "olga", PASSWORD, client_addr="203.0.113.7").status_code == 429
    assert _via_proxy(client, "olga", PASSWORD, client_addr="198.51.100.9").status_code == 302


def test_a_client_cannot_dodge_the_lock_by_claiming_another_address(client, operator, settings):
    settings.E31_TRUSTED_PROXIES = [PROXY]
    for n in range(11):  # each claims a new address on the left; the proxy appends the real one
        _via_proxy(client, "olga", "wrong", client_addr=f"192.0.2.{n}, 203.0.113.7")
    assert _via_proxy(client, "olga", PASSWORD, client_addr="203.0.113.7").status_code == 429


def test_without_trusted_proxies_the_forwarded_header_is_not_believed(client, operator, settings):
    settings.E31_TRUSTED_PROXIES = []
    for n in range(10):
        _via_proxy(client, "olga", "wrong", client_addr=f"192.0.2.{n}")
    # Every attempt came from the proxy's own address, whatever the header claimed.
    assert _via_proxy(client, "olga", PASSWORD, client_addr="198.51.100.9").status_code == 429


def test_the_lock_ends_a_window_after_the_last_failure(client, member, settings):
    settings.E31_LOGIN_WINDOW_S = 1
    for _ in range(10):
        _post(client, "alice", "wrong")
    assert _post(client, "alice", PASSWORD).status_code == 429
    time.sleep(1.2)
    assert _post(client, "alice", PASSWORD).status_code == 302
