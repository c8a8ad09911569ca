"""Who made whom an operator, renamed a team or unlocked an account: each leaves its audit entry.

An operator is an account with ``is_staff`` (``common.operators``); ``is_superuser``, groups and admin permissions
say what else it may do in the admin. Every path that changes them (the admin's user and group pages, the
``set_operator`` and ``createsuperuser`` commands, the demo operator of ``make run``) is audited in the change's
own transaction, as a team's rename in the admin and the removal of a sign-in lockout (the admin,
``axes_reset_*``) are.
A delegated operator who may change accounts changes no other operator's.
"""

import getpass
from datetime import UTC
from io import StringIO

import pytest
from axes.models import AccessAttempt
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from accounts.models import Team
from operations import audit
from operations.models import AuditEntry
from tests.conftest import PASSWORD
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db
NO_RIGHTS = {"is_staff": False, "is_superuser": False, "groups": [], "permissions": []}


def _user_form(user, **changes) -> dict:
    """The account's change form as the admin posts it, with its rights as they are unless ``changes`` says."""
    joined = user.date_joined.astimezone(UTC)
    form = {"username": user.get_username(), "first_name": user.first_name, "email": user.email,
            "date_joined_0": joined.strftime("%Y-%m-%d"), "date_joined_1": joined.strftime("%H:%M:%S"),
            "last_login_0": "", "last_login_1": "", "is_active": "on",
            "groups": list(user.groups.values_list("id", flat=True)),
            "user_permissions": list(user.user_permissions.values_list("id", flat=True))}  # fmt: skip
    form |= {flag: "on" for flag in ("is_staff", "is_superuser") if getattr(user, flag)}
    for flag, value in changes.items():
        if value is None:
            form.pop(flag, None)
        else:
            form[flag] = value
    return form


def _change_user(client, user, **changes):
    return client.post(reverse("admin:auth_user_change", args=[user.id]), _user_form(user, **changes))


def _set_password(client, user, password: str):
    """The admin's password page of ``user``, posted."""
    form = {"password1": password, "password2": password, "usable_password": "true"}
    return client.post(reverse("admin:auth_user_password_change", args=[user.id]), form)


def _entries(action: str) -> list[tuple[str, str, dict, dict]]:
    rows = AuditEntry.objects.filter(action=action).order_by("id")
    return list(rows.values_list("actor", "target", "before", "after"))


# --------------------------------------------------------------------------- operator rights


def test_making_an_account_an_operator_in_the_admin_leaves_an_audit_entry(admin_client, member):
    assert _change_user(admin_client, member, is_staff="on").status_code == 302
    member.refresh_from_db()
    assert member.is_staff
    assert _entries("user.rights") == [("admin", "user:alice", NO_RIGHTS, NO_RIGHTS | {"is_staff": True})]
    entry = AuditEntry.objects.get(action="user.rights")
    assert entry.actor_user_id == type(member).objects.get(username="admin").id and entry.at is not None


def test_taking_an_operators_rights_back_in_the_admin_leaves_an_audit_entry(admin_client, operator):
    assert _change_user(admin_client, operator, is_staff=None).status_code == 302
    operator.refresh_from_db()
    assert not operator.is_staff
    assert _entries("user.rights") == [("admin", "user:olga", NO_RIGHTS | {"is_staff": True}, NO_RIGHTS)]


def test_making_an_operator_a_superuser_in_the_admin_leaves_an_audit_entry(admin_client, operator):
    _change_user(admin_client, operator, is_superuser="on")
    before = NO_RIGHTS | {"is_staff": True}
    assert _entries("user.rights") == [("admin", "user:olga", before, before | {"is_superuser": True})]


def test_giving_an_operator_admin_permissions_or_a_group_in_the_admin_leaves_an_audit_entry(
    admin_client, operator
):
    group = Group.objects.create(name="support")
    permission = Permission.objects.get(content_type__app_label="auth", codename="change_user")
    _change_user(admin_client, operator, groups=[group.id], user_permissions=[permission.id])
    before = NO_RIGHTS | {"is_staff": True}
    after = before | {"groups": ["support"], "permissions": ["auth.change_user"]}
    assert _entries("user.rights") == [("admin", "user:olga", before, after)]


def test_saving_an_account_with_its_rights_unchanged_leaves_no_audit_entry(admin_client, operator):
    assert _change_user(admin_client, operator, first_name="Olga").status_code == 302
    operator.refresh_from_db()
    assert operator.first_name == "Olga" and not AuditEntry.objects.exists()


def test_a_grant_whose_audit_entry_fails_does_not_take_effect(admin_client, member, monkeypatch):
    def broken(**_):
        raise RuntimeError("the audit log is unavailable")

    monkeypatch.setattr(audit, "record", broken)
    with pytest.raises(RuntimeError):
        _change_user(admin_client, member, is_staff="on")
    member.refresh_from_db()
    assert not member.is_staff


@pytest.mark.parametrize("how", ["delete page", "delete action"])
def test_deleting_an_operators_account_in_the_admin_leaves_an_audit_entry(admin_client, operator, how):
    if how == "delete page":
        admin_client.post(reverse("admin:auth_user_delete", args=[operator.id]), {"post": "yes"})
    else:
        form = {"action": "delete_selected", "_selected_action": [operator.id], "post": "yes"}
        admin_client.post(reverse("admin:auth_user_changelist"), form)
    assert not type(operator).objects.filter(id=operator.id).exists()
    assert _entries("user.rights") == [("admin", "user:olga", NO_RIGHTS | {"is_staff": True}, {})]


def test_deleting_an_account_with_no_rights_leaves_no_audit_entry(admin_client):
    loner = UserFactory(username="loner")
    admin_client.post(reverse("admin:auth_user_delete", args=[loner.id]), {"post": "yes"})
    assert not type(loner).objects.filter(id=loner.id).exists() and not AuditEntry.objects.exists()


def test_changing_a_groups_permissions_in_the_admin_leaves_an_audit_entry(admin_client, operator):
    group = Group.objects.create(name="support")
    operator.groups.add(group)
    permission = Permission.objects.get(content_type__app_label="auth", codename="change_user")
    url = reverse("admin:auth_group_change", args=[group.id])
    assert admin_client.post(url, {"name": "support", "permissions": [permission.id]}).status_code == 302
    assert _entries("group.rights") == [
        ("admin", "group:support", {"permissions": []}, {"permissions": ["auth.change_user"]})
    ]


def test_deleting_a_group_with_permissions_in_the_admin_leaves_an_audit_entry(admin_client):
    group = Group.objects.create(name="support")
    group.permissions.add(Permission.objects.get(content_type__app_label="auth", codename="change_user"))
    admin_client.post(reverse("admin:auth_group_delete", args=[group.id]), {"post": "yes"})
    assert not Group.objects.filter(id=group.id).exists()
    assert _entries("group.rights") == [("admin", "group:support", {"permissions": ["auth.change_user"]}, {})]


def test_the_set_operator_command_grants_and_takes_back_operator_rights_audited(member):
    call_command("set_operator", "Alice", stdout=StringIO())
    call_command("set_operator", "alice", "--superuser", stdout=StringIO())
    call_command("set_operator", "alice", "--revoke", stdout=StringIO())
    member.refresh_from_db()
    assert not member.is_staff and not member.is_superuser
    staff, superuser = NO_RIGHTS | {"is_staff": True}, NO_RIGHTS | {"is_staff": True, "is_superuser": True}
    changes = [(target, before, after) for _, target, before, after in _entries("user.rights")]
    assert changes == [
        ("user:alice", NO_RIGHTS, staff),
        ("user:alice", staff, superuser),
        ("user:alice", superuser, NO_RIGHTS),
    ]
    assert all("manage.py set_operator" in actor for actor, *_ in _entries("user.rights"))


def test_the_set_operator_command_changing_nothing_leaves_no_audit_entry(operator):
    out = StringIO()
    call_command("set_operator", "olga", stdout=out)
    assert "already" in out.getvalue() and not AuditEntry.objects.exists()


def test_the_set_operator_command_refuses_an_unknown_account(db):
    with pytest.raises(CommandError, match="no account"):
        call_command("set_operator", "nobody", stdout=StringIO())
    assert not AuditEntry.objects.exists()


def test_the_demo_operator_made_on_the_consoles_first_start_leaves_an_audit_entry(settings):
    settings.E31_DEMO_PASSWORD = ""
    call_command("ensure_demo_accounts", stdout=StringIO())
    call_command("ensure_demo_accounts", stdout=StringIO())  # a restart grants nothing
    after = NO_RIGHTS | {"is_staff": True, "is_superuser": True}
    assert _entries("user.rights") == [("system", "user:operator", NO_RIGHTS, after)]


def test_the_createsuperuser_command_leaves_an_audit_entry(monkeypatch):
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "the first superuser's 8j!N")
    out = StringIO()
    call_command("createsuperuser", interactive=False, username="root", email="root@example.org", stdout=out)
    assert "Superuser created successfully." in out.getvalue()
    after = NO_RIGHTS | {"is_staff": True, "is_superuser": True}
    [(actor, target, before, rights)] = _entries("user.rights")
    assert (target, before, rights) == ("user:root", NO_RIGHTS, after)
    assert "manage.py createsuperuser" in actor


def test_the_createsuperuser_command_asked_at_a_terminal_leaves_an_audit_entry(monkeypatch):
    answers = iter(["Root", "root@example.org"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    monkeypatch.setattr(getpass, "getpass", lambda prompt="": "the first superuser's 8j!N")
    terminal = StringIO()
    terminal.isatty = lambda: True
    call_command("createsuperuser", stdin=terminal, stdout=StringIO(), stderr=StringIO())
    [(actor, target, _, rights)] = _entries("user.rights")
    assert (target, rights["is_superuser"], rights["is_staff"]) == ("user:Root", True, True)
    assert "manage.py createsuperuser" in actor


def test_createsuperuser_makes_no_superuser_whose_audit_entry_fails(monkeypatch):
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "the first superuser's 8j!N")

    def refuse(**kwargs):
        raise RuntimeError("the audit log is down")

    monkeypatch.setattr(audit, "record", refuse)
    with pytest.raises(RuntimeError):
        call_command(
            "createsuperuser", interactive=False, username="root", email="r@x.org", stdout=StringIO()
        )
    assert not get_user_model().objects.filter(username="root").exists()


# --------------------------------------------------------------------------- team names


def _team_form(team: Team, **fields) -> dict:
    form = {"name": team.name, "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"}
    return form | {"memberships-MIN_NUM_FORMS": "0", "memberships-MAX_NUM_FORMS": "1000"} | fields


def test_renaming_a_team_in_the_admin_leaves_an_audit_entry_and_keeps_its_slug(admin_client, team):
    url = reverse("admin:accounts_team_change", args=[team.id])
    assert admin_client.post(url, _team_form(team, name="Vision Lab", slug="vision-lab")).status_code == 302
    team.refresh_from_db()
    assert (team.name, team.slug) == ("Vision Lab", "vision")
    assert _entries("team.rename") == [("admin", "team:vision", {"name": "vision"}, {"name": "Vision Lab"})]


def test_saving_a_team_under_its_own_name_leaves_no_audit_entry(admin_client, team):
    url = reverse("admin:accounts_team_change", args=[team.id])
    assert admin_client.post(url, _team_form(team)).status_code == 302
    assert not AuditEntry.objects.exists()


# --------------------------------------------------------------------------- sign-in lockouts


@pytest.fixture
def locked_out(client, member, settings):
    """alice, locked out from one address after two failed sign-ins."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    member.set_password(PASSWORD)
    member.save()
    settings.E31_LOGIN_FAILURE_LIMIT = 2
    for _ in range(2):
        _sign_in(client, "wrong")
    assert _sign_in(client).status_code == 429
    return AccessAttempt.objects.get(username="alice")


def _sign_in(client, password: str = PASSWORD):
    return client.post(
        reverse("accounts:login"), {"username": "alice", "password": password}, REMOTE_ADDR="203.0.113.7"
    )


UNLOCKED = ("admin", "user:alice", {"ip_address": "203.0.113.7", "failures": 2}, {})


@pytest.mark.parametrize("how", ["delete page", "delete action"])
def test_unlocking_an_account_in_the_admin_leaves_an_audit_entry(admin_client, client, locked_out, how):
    if how == "delete page":
        url = reverse("admin:axes_accessattempt_delete", args=[locked_out.id])
        assert admin_client.post(url, {"post": "yes"}).status_code == 302
    else:
        form = {"action": "delete_selected", "_selected_action": [locked_out.id], "post": "yes"}
        assert admin_client.post(reverse("admin:axes_accessattempt_changelist"), form).status_code == 302
    assert not AccessAttempt.objects.exists()
    assert _entries("user.unlock") == [UNLOCKED]
    assert _sign_in(client).status_code == 302


@pytest.mark.parametrize(
    "command", [("axes_reset_username", "alice"), ("axes_reset_ip", "203.0.113.7"),
                ("axes_reset_ip_username", "203.0.113.7", "alice"), ("axes_reset",)],
)  # fmt: skip
def test_unlocking_an_account_with_an_axes_command_leaves_an_audit_entry(client, locked_out, command):
    out = StringIO()
    call_command(*command, stdout=out)
    assert "1 attempts removed" in out.getvalue() and not AccessAttempt.objects.exists()
    [(actor, *change)] = _entries("user.unlock")
    assert f"manage.py {command[0]}" in actor and tuple(change) == UNLOCKED[1:]
    assert _sign_in(client).status_code == 302


def test_an_axes_command_that_finds_no_lock_leaves_no_audit_entry(db):
    out = StringIO()
    call_command("axes_reset_username", "alice", stdout=out)
    assert "No attempts found" in out.getvalue() and not AuditEntry.objects.exists()


def test_the_admin_pages_whose_saves_and_deletes_are_audited_still_open(admin_client, operator, locked_out):
    group = Group.objects.create(name="support")
    for url in (
        reverse("admin:auth_user_change", args=[operator.id]),
        reverse("admin:auth_group_change", args=[group.id]),
        reverse("admin:axes_accessattempt_changelist"),
        reverse("admin:axes_accessattempt_change", args=[locked_out.id]),
        reverse("admin:axes_accessattempt_delete", args=[locked_out.id]),
    ):
        assert admin_client.get(url).status_code == 200, url


# --------------------------------------------------------------------------- no escalation by a delegated operator


@pytest.fixture
def delegate(operator, client):
    """An operator trusted to manage accounts and groups in the admin, not a superuser."""
    operator.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_user", "change_user", "view_group", "change_group"])
    )
    client.force_login(operator)
    return client


def test_an_operator_who_may_change_accounts_cannot_make_anyone_a_superuser_or_give_permissions(
    delegate, operator, member
):
    everything = list(Permission.objects.values_list("id", flat=True))
    _change_user(delegate, operator, is_superuser="on", user_permissions=everything)
    _change_user(delegate, member, is_superuser="on", user_permissions=everything)
    for account in (operator, member):
        account.refresh_from_db()
        assert not account.is_superuser
        assert account.user_permissions.count() <= 4


def test_an_operator_who_may_change_accounts_cannot_make_a_member_an_operator(delegate, member):
    """Otherwise it sets a member's password, then makes that account an operator: a second one of its own."""
    _change_user(delegate, member, is_staff="on")
    member.refresh_from_db()
    assert not member.is_staff and not AuditEntry.objects.exists()


def test_an_operator_who_may_change_groups_cannot_add_permissions_to_a_group(delegate, operator):
    group = Group.objects.create(name="helpers")
    operator.groups.add(group)
    everything = list(Permission.objects.values_list("id", flat=True))
    delegate.post(
        reverse("admin:auth_group_change", args=[group.id]), {"name": "helpers", "permissions": everything}
    )
    assert group.permissions.count() == 0


def test_an_operator_who_may_change_accounts_cannot_take_a_superusers_account(delegate, operator):
    """Its password set, its operator rights or its name changed, or the account deleted: each would hand the
    delegate a superuser's rights, by another door than the read-only flags."""
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    root.set_password("the superuser's own secret 1")
    root.save()
    new = "chosen by the delegate 7x!Q"
    answered = _set_password(delegate, root, new)
    assert answered.status_code == 403
    assert _change_user(delegate, root, is_staff=None, username="rooted").status_code == 403
    assert (
        delegate.post(reverse("admin:auth_user_delete", args=[root.id]), {"post": "yes"}).status_code == 403
    )
    root.refresh_from_db()
    assert root.check_password("the superuser's own secret 1")
    assert (root.username, root.is_staff) == ("root", True)


def test_an_operator_who_may_delete_accounts_cannot_delete_a_superuser_with_the_delete_action(
    operator, client
):
    operator.user_permissions.add(*Permission.objects.filter(codename__in=["view_user", "delete_user"]))
    client.force_login(operator)
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.post(
        reverse("admin:auth_user_changelist"),
        {"action": "delete_selected", "_selected_action": [root.id], "post": "yes"},
    )
    assert type(root).objects.filter(id=root.id).exists()


@pytest.fixture
def peer(db):
    """Another operator, not a superuser: the delegate's peer."""
    peer = UserFactory(username="petra", is_staff=True)
    peer.set_password("the peer's own secret 3")
    peer.save()
    return peer


def test_an_operator_who_may_change_accounts_cannot_take_another_operators_account(delegate, peer):
    """Its password set on the admin's password page, or its name changed, would hand the delegate a peer's
    operator rights, and the peer's own delegations with them."""
    new = "chosen by the delegate 7x!Q"
    password_page = reverse("admin:auth_user_password_change", args=[peer.id])
    assert delegate.get(password_page).status_code == 403
    answered = delegate.post(password_page, {"password1": new, "password2": new, "usable_password": "true"})
    assert answered.status_code == 403
    assert _change_user(delegate, peer, username="taken").status_code == 403
    peer.refresh_from_db()
    assert peer.check_password("the peer's own secret 3")
    assert peer.username == "petra"


def test_an_operator_who_may_delete_accounts_cannot_delete_another_operator(operator, peer, client):
    operator.user_permissions.add(*Permission.objects.filter(codename__in=["view_user", "delete_user"]))
    client.force_login(operator)
    assert client.post(reverse("admin:auth_user_delete", args=[peer.id]), {"post": "yes"}).status_code == 403
    client.post(
        reverse("admin:auth_user_changelist"),
        {"action": "delete_selected", "_selected_action": [peer.id], "post": "yes"},
    )
    assert type(peer).objects.filter(id=peer.id).exists()


def test_an_operator_who_may_change_accounts_still_changes_a_members_account_and_its_own(
    delegate, operator, member
):
    new = "set by the delegate 5k!W"
    answered = _set_password(delegate, member, new)
    assert answered.status_code == 302
    assert _change_user(delegate, operator, first_name="Olga").status_code == 302
    mine = "the delegate's own 9m!R"
    answered = _set_password(delegate, operator, mine)
    assert answered.status_code == 302
    member.refresh_from_db()
    operator.refresh_from_db()
    assert member.check_password(new) and operator.check_password(mine) and operator.first_name == "Olga"


def test_an_operator_still_changes_its_own_password_on_the_admins_own_page(operator, client):
    operator.set_password(PASSWORD)
    operator.save()
    client.force_login(operator)
    new = "the operator's new one 4t!Z"
    answered = client.post(
        reverse("admin:password_change"),
        {"old_password": PASSWORD, "new_password1": new, "new_password2": new},
    )
    assert answered.status_code == 302
    operator.refresh_from_db()
    assert operator.check_password(new)


def test_a_superuser_still_changes_and_deletes_an_operators_account(admin_client, peer):
    new = "set by the superuser 2p!V"
    answered = _set_password(admin_client, peer, new)
    assert answered.status_code == 302
    peer.refresh_from_db()
    assert peer.check_password(new)
    admin_client.post(reverse("admin:auth_user_delete", args=[peer.id]), {"post": "yes"})
    assert not type(peer).objects.filter(id=peer.id).exists()


# --------------------------------------------------------------------------- sign-in details


def test_an_accounts_address_name_active_flag_and_password_changed_in_the_admin_are_audited(
    admin_client, member
):
    """Reproduction: an operator changed a member's e-mail (which signs them in, and which team invitations go to),
    deactivated them and set their password in the admin, and the audit log held none of it."""
    before = {"username": "alice", "email": member.email, "is_active": True}
    assert _change_user(admin_client, member, email="mallory@elsewhere.example").status_code == 302
    member.refresh_from_db()  # the next form posts the account as it is now
    assert _change_user(admin_client, member, is_active=None).status_code == 302
    assert _set_password(admin_client, member, "a brand new passphrase 77").status_code == 302
    moved = before | {"email": "mallory@elsewhere.example"}
    assert _entries("user.account") == [
        ("admin", "user:alice", before, moved),
        ("admin", "user:alice", moved, moved | {"is_active": False}),
        ("admin", "user:alice", {"password": "was set"}, {"password": "set anew"}),
    ]
    assert "brand new" not in str(list(AuditEntry.objects.values()))
    assert _entries("user.rights") == []  # an account's details are not its rights


def test_a_save_that_changes_no_detail_leaves_no_account_entry(admin_client, member):
    assert _change_user(admin_client, member).status_code == 302
    assert _entries("user.account") == []
