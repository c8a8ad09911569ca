"""Teams, tokens and accounts in the admin: what the services write, the admin shows but does not write.

A team's members change on its members page (``accounts.members``: audited, the team keeps an admin who can sign
in), its share and egress on the operator's team page and its budget on the budget page (audited); a token is
its user's, stored as its digest, and revoked for good. Edits here would skip those rules and leave no audit
entry, so the admin shows these fields and links the pages that change them.
"""

from django.contrib import admin
from django.contrib.auth import admin as auth_admin
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from accounts import members, services, usernames
from accounts.models import ApiToken, Membership, Team

# Set on the operator's team page (share, egress) and the budget page, each audited.
TEAM_POLICY = ("share", "monthly_budget_gpu_hours", "budget_enforced", "egress_allowed")


class MembershipInline(admin.TabularInline):
    """Read-only: the members page adds, promotes and removes, audited, and never takes a team's last admin."""

    model = Membership
    extra = 0
    fields = ("user", "role", "joined_at")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("name", "share", "monthly_budget_gpu_hours", "budget_enforced")
    inlines = [MembershipInline]
    prepopulated_fields = {"slug": ("name",)}

    # The slug names the team's folder of every data and output root and its S3 prefixes: a rename would
    # leave the old folders to whichever team is later given that slug. A new team starts with the defaults
    # of its policy; the audited pages change them.
    def get_readonly_fields(self, request, obj=None):
        return ("slug", *TEAM_POLICY, "changed_on") if obj is not None else TEAM_POLICY

    def get_prepopulated_fields(self, request, obj=None):
        return {} if obj is not None else self.prepopulated_fields

    # Deleting a team would take its members, secrets and open invitations with it, unaudited, and free its
    # slug, and so its folders, for the next team given that name.
    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="Changed on")
    def changed_on(self, team: Team) -> str:
        return format_html(
            '<a href="{}">the members page</a> (invite, role, remove) · <a href="{}">the operator\'s team page</a> '
            '(share, egress) · <a href="{}">the budget page</a>',
            reverse("accounts:members", args=[team.slug]),
            reverse("operations:team", args=[team.slug]),
            reverse("metering:budget", args=[team.slug]),
        )


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Read-only: a token is made by its user (shown once, kept as its digest), stays theirs and, once revoked,
    stays revoked. An operator revokes leaked tokens with the action, through the service."""

    list_display = ("prefix", "user", "label", "created_at", "revoked_at")
    list_filter = ("revoked_at",)
    actions = ["revoke_tokens"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_revoke_permission(self, request) -> bool:
        return request.user.has_perm("accounts.change_apitoken")

    @admin.action(description="Revoke the selected tokens", permissions=["revoke"])
    def revoke_tokens(self, request, queryset: QuerySet[ApiToken]) -> None:
        now = timezone.now()
        tokens = list(queryset.select_related("user"))
        revoked = sum(services.revoke_api_token(token_id=t.id, user=t.user, now=now) for t in tokens)
        self.message_user(
            request, f"Revoked {revoked} of {len(tokens)} selected tokens (the rest were already)."
        )


class UserChangeForm(auth_admin.UserAdmin.form):
    def clean_username(self) -> str:
        """No rename onto another account's name in another case (``accounts.usernames``), said on the form."""
        name = self.cleaned_data["username"]
        if usernames.taken(name, exclude_id=self.instance.pk):
            raise ValidationError(usernames.TAKEN, code="unique")
        return name

    def clean_is_active(self) -> bool:
        """A team keeps an admin who can sign in: the last one is not deactivated (``members._keep_an_admin``)."""
        active = self.cleaned_data["is_active"]
        if self.instance.pk is None or active or not self.instance.is_active:
            return active
        admin_of = Membership.objects.filter(user=self.instance, role=members.ADMIN).select_related(
            "team", "user"
        )
        # The teams' row locks, taken as the members' writers take them and held until the admin's save commits: a
        # demotion of the team's other admin at the same moment waits, then finds this one deactivated.
        teams = Team.objects.select_for_update().filter(id__in=admin_of.values("team_id")).order_by("id")
        list(teams.values_list("id", flat=True))
        refusals = []
        for membership in admin_of:
            try:
                members._keep_an_admin(membership, "deactivated")
            except members.MembershipRefused as exc:
                refusals.append(f"{membership.team}: {exc}")
        if refusals:
            raise ValidationError(refusals)
        return active


admin.site.unregister(get_user_model())


@admin.register(get_user_model())
class UserAdmin(auth_admin.UserAdmin):
    form = UserChangeForm

    # Deleting an account would remove its memberships unaudited, and maybe a team's last admin: it leaves its
    # teams on their members pages first.
    def get_deleted_objects(self, objs, request):
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        for membership in Membership.objects.filter(user__in=objs).select_related("team", "user"):
            protected.append(
                format_html(
                    '{} — remove them on <a href="{}">the members page</a> first',
                    membership,
                    reverse("accounts:members", args=[membership.team.slug]),
                )
            )
        return deleted, counts, perms_needed, protected
