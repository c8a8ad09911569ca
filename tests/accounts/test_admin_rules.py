"""The Django admin keeps the services' rules: it writes no membership, share, budget, egress or token change
the services would refuse or audit. A team keeps an admin who can sign in, every membership change has its audit
entry, and a token stays its own user's, revoked for good; the admin shows these and sends operators to the pages
(members, operator team page, budget) that make the changes."""

from datetime import UTC

import pytest
from django.urls import reverse
from django.utils import timezone

from accounts import services
from accounts.models import ApiToken, Membership, Team
from operations.models import AuditEntry
from tests.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db


def _team_form(team: Team, *rows: dict, **fields) -> dict:
    """The team's change form as the admin posts it, with one inline row per membership given."""
    form = {"name": team.name, "slug": team.slug, "share": "1", "budget_enforced": "on", **fields}
    form |= {"memberships-TOTAL_FORMS": str(len(rows)), "memberships-INITIAL_FORMS": str(len(rows))}
    form |= {"memberships-MIN_NUM_FORMS": "0", "memberships-MAX_NUM_FORMS": "1000"}
    for i, row in enumerate(rows):
        form |= {f"memberships-{i}-{key}": value for key, value in row.items()}
    return form


def _row(membership: Membership, **changes) -> dict:
    row = {
        "id": membership.id,
        "team": membership.team_id,
        "user": membership.user_id,
        "role": membership.role,
    }
    return row | changes


def _change_team(client, team: Team, form: dict):
    return client.post(reverse("admin:accounts_team_change", args=[team.id]), form)


def test_the_admin_cannot_demote_a_teams_last_admin(admin_client, team, team_admin):
    only_admin = Membership.objects.get(team=team, user=team_admin)
    _change_team(admin_client, team, _team_form(team, _row(only_admin, role="member")))
    assert Membership.objects.get(id=only_admin.id).role == "admin"


@pytest.mark.parametrize("who", ["team_admin", "member"])
def test_the_admin_removes_nobody_from_a_team_unaudited(admin_client, team, team_admin, member, who):
    user = {"team_admin": team_admin, "member": member}[who]
    rows = [
        _row(m, DELETE="on" if m.user_id == user.id else "") for m in Membership.objects.filter(team=team)
    ]
    _change_team(admin_client, team, _team_form(team, *rows))
    assert Membership.objects.filter(team=team, user=user).exists()


def test_the_admin_adds_nobody_to_a_team_unaudited(admin_client, team, team_admin):
    newcomer = UserFactory(username="nina")
    rows = [_row(Membership.objects.get(team=team, user=team_admin))]
    form = _team_form(team, *rows, {"team": team.id, "user": newcomer.id, "role": "admin"})
    form["memberships-INITIAL_FORMS"] = "1"
    _change_team(admin_client, team, form)
    added = Membership.objects.filter(team=team, user=newcomer).exists()
    assert not added or AuditEntry.objects.filter(action="team.member-add").exists()
    assert not added


def test_the_team_page_in_the_admin_shows_the_members_and_links_the_pages_that_change_them(
    admin_client, team, team_admin
):
    page = admin_client.get(reverse("admin:accounts_team_change", args=[team.id])).content.decode()
    assert "adele" in page and 'name="memberships-0-role"' not in page
    for url in (
        reverse("accounts:members", args=[team.slug]),
        reverse("operations:team", args=[team.slug]),
        reverse("metering:budget", args=[team.slug]),
    ):
        assert f'href="{url}"' in page


@pytest.mark.parametrize(
    ("field", "posted"),
    [("share", "0"), ("share", "5"), ("monthly_budget_gpu_hours", "-5"), ("egress_allowed", "on"),
     ("budget_enforced", "")],
)  # fmt: skip
def test_the_admin_changes_no_share_budget_or_egress_unaudited(admin_client, team, field, posted):
    before = getattr(Team.objects.get(id=team.id), field)
    response = _change_team(admin_client, team, _team_form(team, **{field: posted}))
    assert response.status_code in (200, 302)
    assert getattr(Team.objects.get(id=team.id), field) == before
    assert not AuditEntry.objects.exists()


def test_a_team_added_in_the_admin_gets_the_default_share_budget_and_egress(admin_client):
    form = {"name": "speech", "slug": "speech", "share": "0", "monthly_budget_gpu_hours": "-5",
            "egress_allowed": "on", "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"}  # fmt: skip
    assert admin_client.post(reverse("admin:accounts_team_add"), form).status_code == 302
    added = Team.objects.get(slug="speech")
    assert (added.share, added.monthly_budget_gpu_hours, added.budget_enforced, added.egress_allowed) == (
        1.0, None, True, False,
    )  # fmt: skip


def test_the_admin_deletes_no_team(admin_client, team, team_admin):
    url = reverse("admin:accounts_team_delete", args=[team.id])
    admin_client.post(url, {"post": "yes"})
    assert Membership.objects.filter(team=team, user=team_admin, role="admin").exists()


# --------------------------------------------------------------------------- API tokens


@pytest.fixture
def token(member):
    row, plain = services.create_api_token(user=member, label="laptop")
    return row, plain


def _token_form(row: ApiToken, **changes) -> dict:
    form = {"user": row.user_id, "label": row.label, "last_used_at_0": "", "last_used_at_1": ""}
    form |= {"revoked_at_0": "", "revoked_at_1": ""}
    return form | changes


def _user_of(plain: str):
    return services.user_for_token(token=plain, now=timezone.now())


def test_the_admin_cannot_hand_a_token_to_another_user(admin_client, token, member, outsider):
    row, plain = token
    admin_client.post(
        reverse("admin:accounts_apitoken_change", args=[row.id]), _token_form(row, user=outsider.id)
    )
    assert _user_of(plain) == member


def test_the_admin_cannot_bring_a_revoked_token_back(admin_client, token, member):
    row, plain = token
    services.revoke_api_token(token_id=row.id, user=member, now=timezone.now())
    admin_client.post(reverse("admin:accounts_apitoken_change", args=[row.id]), _token_form(row))
    assert _user_of(plain) is None


def test_the_admin_makes_no_token_that_is_no_digest_of_one(admin_client, member):
    form = {"user": member.id, "label": "by hand", "last_used_at_0": "", "last_used_at_1": ""}
    admin_client.post(reverse("admin:accounts_apitoken_add"), form | {"revoked_at_0": "", "revoked_at_1": ""})
    assert not ApiToken.objects.filter(label="by hand").exists()


def test_the_admin_revokes_tokens_through_the_service(admin_client, token, member):
    row, plain = token
    changelist = reverse("admin:accounts_apitoken_changelist")
    response = admin_client.post(changelist, {"action": "revoke_tokens", "_selected_action": [row.id]})
    assert response.status_code == 302
    assert _user_of(plain) is None and ApiToken.objects.get(id=row.id).revoked_at is not None
    [entry] = AuditEntry.objects.filter(action="user.token-revoke")
    assert (entry.actor, entry.target) == ("admin", f"user:{member.username}")
    assert entry.after == {"token": row.prefix, "label": "laptop", "revoked": True}


def test_a_user_revoking_their_own_token_is_audited_too(token, member):
    row, _ = token
    assert services.revoke_api_token(token_id=row.id, user=member, now=timezone.now())
    assert AuditEntry.objects.filter(action="user.token-revoke", actor=member.username).count() == 1
    assert not services.revoke_api_token(token_id=row.id, user=member, now=timezone.now())  # once
    assert AuditEntry.objects.filter(action="user.token-revoke").count() == 1


@pytest.mark.parametrize("how", ["delete page", "delete action"])
def test_the_admin_deletes_no_token(admin_client, token, how):
    """Reproduction: a superuser deleted a token row (its prefix, label, last use gone) with no trace."""
    row, _ = token
    if how == "delete page":
        response = admin_client.post(
            reverse("admin:accounts_apitoken_delete", args=[row.id]), {"post": "yes"}
        )
        assert response.status_code == 403
    else:
        changelist = reverse("admin:accounts_apitoken_changelist")
        admin_client.post(
            changelist, {"action": "delete_selected", "_selected_action": [row.id], "post": "yes"}
        )
    assert ApiToken.objects.filter(id=row.id).exists()


# --------------------------------------------------------------------------- accounts


@pytest.mark.parametrize("how", ["delete page", "delete action"])
@pytest.mark.parametrize("who", ["team_admin", "member"])
def test_the_admin_deletes_no_account_that_is_in_a_team(admin_client, team, team_admin, member, who, how):
    user = {"team_admin": team_admin, "member": member}[who]
    if how == "delete page":
        admin_client.post(reverse("admin:auth_user_delete", args=[user.id]), {"post": "yes"})
    else:
        form = {"action": "delete_selected", "_selected_action": [user.id], "post": "yes"}
        admin_client.post(reverse("admin:auth_user_changelist"), form)
    assert Membership.objects.filter(team=team, user=user).exists()


@pytest.mark.parametrize("tokens", [0, 1], ids=["no token", "with a token"])
def test_the_admin_still_deletes_an_account_in_no_team(admin_client, db, tokens):
    """With a token too: tokens are never deleted alone, but go with their account (a review found the token
    rule had made every account holding one undeletable, 403)."""
    loner = UserFactory(username="loner")
    for _ in range(tokens):
        services.create_api_token(user=loner, label="laptop")
    response = admin_client.post(reverse("admin:auth_user_delete", args=[loner.id]), {"post": "yes"})
    assert response.status_code == 302
    assert not type(loner).objects.filter(id=loner.id).exists()
    assert not ApiToken.objects.filter(user_id=loner.id).exists()


def _user_form(user, **changes) -> dict:
    joined = user.date_joined.astimezone(UTC)
    form = {"username": user.get_username(), "is_active": "on", "date_joined_0": joined.strftime("%Y-%m-%d"),
            "date_joined_1": joined.strftime("%H:%M:%S"), "last_login_0": "", "last_login_1": ""}  # fmt: skip
    return form | changes


def test_the_admin_cannot_deactivate_a_teams_only_admin_who_can_sign_in(admin_client, team, team_admin):
    form = _user_form(team_admin)
    del form["is_active"]
    response = admin_client.post(reverse("admin:auth_user_change", args=[team_admin.id]), form)
    team_admin.refresh_from_db()
    assert team_admin.is_active
    assert response.status_code == 200 and "make another member an admin first" in response.content.decode()


def test_the_admin_still_deactivates_an_admin_when_the_team_keeps_another(admin_client, team, team_admin):
    MembershipFactory(team=team, user=UserFactory(username="ada"), role="admin")
    form = _user_form(team_admin)
    del form["is_active"]
    response = admin_client.post(reverse("admin:auth_user_change", args=[team_admin.id]), form)
    assert response.status_code == 302
    team_admin.refresh_from_db()
    assert not team_admin.is_active


def test_the_admin_still_saves_an_accounts_other_fields(admin_client, team, team_admin):
    form = _user_form(team_admin, first_name="Adele")
    assert admin_client.post(reverse("admin:auth_user_change", args=[team_admin.id]), form).status_code == 302
    team_admin.refresh_from_db()
    assert team_admin.first_name == "Adele" and team_admin.is_active


def test_the_admin_refuses_a_rename_onto_another_accounts_name_in_another_case_in_words(
    admin_client, member, team_admin
):
    """alice exists; renaming adele to "ALICE " in the admin was stopped only by the save's own check: an error page."""
    form = _user_form(team_admin, username="ALICE ")
    response = admin_client.post(reverse("admin:auth_user_change", args=[team_admin.id]), form)
    assert (
        response.status_code == 200
        and "an account with this name already exists" in response.content.decode()
    )
    team_admin.refresh_from_db()
    assert team_admin.username == "adele"
