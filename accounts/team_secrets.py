"""Team secrets: named values a team enters once and its jobs receive as environment variables.

Values are encrypted at rest with Fernet (AES-CBC with an HMAC-SHA256, from ``cryptography``) under
keys of their own (``E31_SECRETS_KEYS``), never ``SECRET_KEY``: a leaked session-signing key then
opens no secret, and the secrets key can be rotated on its own. ``MultiFernet`` decrypts with any
listed key and encrypts with the first, so a rotation is a new key put first, ``rotate`` over the
rows, then the old key dropped. Pages and the API only write, replace and delete values and list
names; the one reader is ``values_for_attempt``, called by a node agent for the attempt it starts.
"""

import os
import re
from datetime import datetime

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from accounts import signals
from accounts.models import Membership, Team, TeamSecret

# The same rule as a declared environment variable's name (jobs.declaration), kept here so that
# accounts imports nothing of jobs: a secret is a variable the job receives.
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
RESERVED = re.compile(r"^(E31_.*|CUDA_VISIBLE_DEVICES)$")
MAX_VALUE_BYTES = 64 * 1024
MAX_PER_TEAM = 100


class SecretInvalid(ValueError):
    """A name or value the store refuses; the message names the rule and never holds the value."""


class SecretsUnavailable(RuntimeError):
    """A secret the job declared cannot be handed over (deleted since intake, or the key does not open it)."""


class SubmitterGone(SecretsUnavailable):
    """Whoever submitted the job may no longer act for its team (removed from it, or the account deactivated):
    the job gets none of the team's secrets, and its attempt does not start."""


def keys() -> list[str]:
    """E31_SECRETS_KEYS, or outside production a key made once under the state directory (0600)."""
    if settings.E31_SECRETS_KEYS:
        return list(settings.E31_SECRETS_KEYS)
    path = settings.E31_SECRETS_KEY_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:  # O_EXCL: two processes starting at once keep the first one's key
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as handle:
                handle.write(Fernet.generate_key().decode())
    return [path.read_text().strip()]


def _fernet() -> MultiFernet:
    try:
        return MultiFernet([Fernet(key.encode()) for key in keys()])
    except ValueError as exc:  # never echo the key
        raise SecretsUnavailable("E31_SECRETS_KEYS holds a key that is not a Fernet key") from exc


def seal(value: str) -> str:
    """``value`` encrypted under the first secrets key: for any other secret the console keeps to use itself
    (a webhook's signing secret), held like the team's."""
    return _fernet().encrypt(value.encode()).decode()


def unseal(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken as exc:
        raise SecretsUnavailable("E31_SECRETS_KEYS cannot open a sealed secret (a key was dropped?)") from exc


def reseal(token: str) -> str:
    """``token`` re-encrypted under the first key (a rotation); SecretsUnavailable if no key opens it."""
    try:
        return _fernet().rotate(token.encode()).decode()
    except InvalidToken as exc:
        raise SecretsUnavailable("E31_SECRETS_KEYS cannot open a sealed secret (a key was dropped?)") from exc


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise SecretInvalid("a secret's name is letters, digits and _, not starting with a digit")
    if RESERVED.fullmatch(name):
        raise SecretInvalid(f"{name} is set by the platform and cannot be a secret")
    return name


def _check_value(value: str) -> None:
    if not isinstance(value, str) or not value:
        raise SecretInvalid("a secret's value cannot be empty")
    try:  # JSON's "\ud800" decodes to a lone surrogate: no UTF-8, so neither encryptable nor a variable's value
        value.encode()
    except UnicodeEncodeError as exc:
        raise SecretInvalid("a secret's value is UTF-8 text, and a lone surrogate is not") from exc
    if "\x00" in value or len(value.encode()) > MAX_VALUE_BYTES:
        raise SecretInvalid(f"a secret's value has no NUL byte and at most {MAX_VALUE_BYTES // 1024} KB")


@transaction.atomic
def set_secret(*, team: Team, name: str, value: str, user, now: datetime) -> TeamSecret:
    """Stores (or replaces) a team's secret, encrypted; the value is never readable through the console again."""
    check_name(name)
    _check_value(value)
    existing = TeamSecret.objects.select_for_update().filter(team=team, name=name).first()
    if existing is None and TeamSecret.objects.filter(team=team).count() >= MAX_PER_TEAM:
        raise SecretInvalid(f"a team holds at most {MAX_PER_TEAM} secrets")
    token = _fernet().encrypt(value.encode()).decode()
    said = {"name": name}
    if existing is None:
        _changed(team, "team.secret-set", {}, said, actor=user, now=now)
    else:
        _changed(team, "team.secret-replace", said, said, actor=user, now=now)
    row, _ = TeamSecret.objects.update_or_create(
        team=team, name=name, defaults={"token": token, "set_by": user, "updated_at": now},
        create_defaults={"token": token, "set_by": user, "updated_at": now, "created_at": now},
    )  # fmt: skip
    return row


@transaction.atomic
def delete_secret(*, team: Team, name: str, user, now: datetime) -> bool:
    """Deletes a team's secret; False if it had none of that name. Jobs that declared it fail to start."""
    deleted, _ = TeamSecret.objects.filter(team=team, name=name).delete()
    if deleted:
        _changed(team, "team.secret-delete", {"name": name}, {}, actor=user, now=now)
    return bool(deleted)


def _changed(team: Team, action: str, before: dict, after: dict, *, actor, now: datetime) -> None:
    signals.secret_changed.send(
        sender=TeamSecret, team=team, action=action, before=before, after=after, actor=actor, now=now
    )


def names(team: Team) -> list[str]:
    return list(TeamSecret.objects.filter(team=team).values_list("name", flat=True))


def check_submitter(*, team_id: int, user_id: int | None) -> None:
    """Raises SubmitterGone unless the job's submitter may still act for the team: an active member of it, or an
    active operator (``is_staff``: an operator re-runs a team's job as themselves, ``operations.services``).

    Read at each attempt's start, not at submission: a member removed, or an account deactivated, after queueing
    jobs must not have them start later with the secrets (perhaps rotated since) of a team no longer theirs.
    A job with no submitter passes: its account was deleted (deleting an account cancels its live jobs, running
    ones too, ``jobs.membership``) or the platform made it itself (benchmarks, tests), and nobody's membership
    can lapse. Here rather than in ``accounts.selectors``: it guards the one reader of the secrets, beside it.
    """
    if user_id is None:
        return
    user = (
        get_user_model()
        ._default_manager.filter(pk=user_id)
        .values("username", "is_active", "is_staff")
        .first()
    )
    if user is None:  # deleted between the job's read and this one
        raise SubmitterGone("the account that submitted it was deleted")
    if not user["is_active"]:
        raise SubmitterGone(f"the account {user['username']} is deactivated")
    if not user["is_staff"] and not Membership.objects.filter(team_id=team_id, user_id=user_id).exists():
        team = Team.objects.filter(id=team_id).values_list("name", flat=True).first()
        raise SubmitterGone(f"{user['username']} is no longer a member of team {team}")


def values_for_attempt(*, team_id: int, declared: list[str]) -> dict[str, str]:
    """The decrypted values of the secrets a job declared, for the attempt its node agent is starting."""
    if not declared:
        return {}
    rows = dict(TeamSecret.objects.filter(team_id=team_id, name__in=declared).values_list("name", "token"))
    if missing := [name for name in declared if name not in rows]:
        raise SecretsUnavailable(f"the team has no secret named {', '.join(missing)} any more")
    fernet = _fernet()
    try:
        return {name: fernet.decrypt(rows[name].encode()).decode() for name in declared}
    except InvalidToken as exc:
        raise SecretsUnavailable(
            "E31_SECRETS_KEYS cannot open the team's secrets (a key was dropped?)"
        ) from exc


def registry_secret_name(registry_host: str) -> str:
    """The secret holding a team's login ("user:password") for a registry: REGISTRY_ and the host in capitals,
    each "." one underscore, each "-" two and the ":" before a port three
    (my-registry.example.com:5000 -> REGISTRY_MY__REGISTRY_EXAMPLE_COM___5000).

    One host per name, so a login never reaches a look-alike host: registry.corp-example.com is not
    registry.corp.example.com. In a registry host (as ``jobs.imageref`` accepts it) a dot stands alone
    between letters or digits, dashes sit inside a label and the colon between the host and its port,
    so each run of underscores (one, an even number, three) reads back one way only."""
    escaped = registry_host.upper().replace("-", "__").replace(":", "___").replace(".", "_")
    return "REGISTRY_" + re.sub(r"[^A-Z0-9_]", "_", escaped)


def registry_login(*, team_id: int, registry_host: str) -> tuple[str, str]:
    """(user, password) from the team's registry secret for this host; ("", "") when it stored none."""
    name = registry_secret_name(registry_host)
    if not TeamSecret.objects.filter(team_id=team_id, name=name).exists():
        return "", ""
    user, _, password = values_for_attempt(team_id=team_id, declared=[name])[name].partition(":")
    return user, password


@transaction.atomic
def rotate() -> int:
    """Re-encrypts every secret under the first key of E31_SECRETS_KEYS; returns how many rows."""
    count = 0
    for row in TeamSecret.objects.select_for_update().order_by("id"):
        TeamSecret.objects.filter(id=row.id).update(token=reseal(row.token))
        count += 1
    return count
