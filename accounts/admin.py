"""Teams, tokens and accounts in the admin: what the services write, the admin shows but does not write.

A team's members change on its members page (``accounts.members``: audited, the team keeps an admin who can sign
in), its share and egress on the operator's team page and its budget on the budget page (audited); a token is
its user's, stored as its digest, and revoked for good. Edits here would skip those rules and leave no audit
entry, so the admin shows these fields and links the pages that change them.

What the admin does write that operators must answer for is audited in the save's own transaction, through
``accounts.services``: a team's new name, an account's rights (operator, superuser, groups, admin permissions)
and a group's permissions, and each sign-in lockout deleted (axes' access attempts).
"""

from axes import admin as axes_admin
from axes.models import AccessAttempt
from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.contrib.auth import admin as auth_admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Model, QuerySet
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from accounts import members, services, usernames
from accounts.addresses import NotPlain
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

    def save_model(self, request, obj: Team, form, change: bool) -> None:
        if not change:
            super().save_model(request, obj, form, change)
            return
        # A team's name is the one field its page changes (get_readonly_fields): renamed through the audited writer.
        services.rename_team(team_id=obj.pk, name=obj.name, actor=request.user, now=timezone.now())

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

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # its prefix, label and last use are the trace of what it did: revoked, never erased

    def has_revoke_permission(self, request) -> bool:
        return request.user.has_perm("accounts.change_apitoken")

    @admin.action(description="Revoke the selected tokens", permissions=["revoke"])
    def revoke_tokens(self, request, queryset: QuerySet[ApiToken]) -> None:
        now = timezone.now()
        tokens = list(queryset.select_related("user"))
        revoked = sum(
            services.revoke_api_token(token_id=t.id, user=t.user, now=now, actor=request.user) for t in tokens
        )
        self.message_user(
            request, f"Revoked {revoked} of {len(tokens)} selected tokens (the rest were already)."
        )


def _plain(value: str) -> str:
    """An address typed in the admin in the form accounts keep it (``usernames.plain``), said on the form."""
    try:
        return usernames.plain(value)
    except NotPlain as exc:
        raise ValidationError(str(exc), code="invalid") from None


class UserCreationForm(auth_admin.UserAdmin.add_form):
    def clean_username(self) -> str:
        return _plain(super().clean_username())


class UserChangeForm(auth_admin.UserAdmin.form):
    # An address is checked only where it changes: one stored before the check still saves the account's other
    # fields (a look-alike account is what an operator most wants to deactivate).
    def clean_username(self) -> str:
        """No rename onto another account's name in another case (``accounts.usernames``), said on the form."""
        name = self.cleaned_data["username"]
        if "username" in self.changed_data:
            name = _plain(name)
        if usernames.taken(name, exclude_id=self.instance.pk):
            raise ValidationError(usernames.TAKEN, code="unique")
        return name

    def clean_email(self) -> str:
        email = self.cleaned_data["email"]
        return _plain(email) if "email" in self.changed_data else email

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


class AuditedRightsAdmin(admin.ModelAdmin):
    """Each save or delete that changes what an account or a group may do is told to the audit log, with the
    rights as stored before and after (``accounts.services.user_rights``), in the save's transaction.

    Only a superuser grants admin rights (``superuser_fields``): an operator trusted with changing accounts or
    groups would otherwise give them to itself or to an account it controls, the operator's flag, a superuser's or
    every permission included."""

    rights_kind = ""
    no_rights: dict = {}
    superuser_fields: tuple[str, ...] = ()

    def get_readonly_fields(self, request, obj=None):
        fields = tuple(super().get_readonly_fields(request, obj))
        return fields if request.user.is_superuser else fields + self.superuser_fields

    def rights(self, obj: Model) -> dict:
        raise NotImplementedError

    def rights_name(self, obj: Model) -> str:
        return str(obj)

    def save_model(self, request, obj, form, change: bool) -> None:
        # Read before the save: the form has already set the new flags on ``obj``; its groups and permissions are
        # saved after it (save_related), where the rights after are read.
        form.rights_before = self.rights(obj) if change else self.no_rights
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        after = self.rights(form.instance)
        self._announce(request, self.rights_name(form.instance), form.rights_before, after)

    def delete_model(self, request, obj) -> None:
        before, name = self.rights(obj), self.rights_name(obj)
        super().delete_model(request, obj)
        if before != self.no_rights:
            self._announce(request, name, before, {})

    @transaction.atomic  # unlike the delete page, the delete action runs in no transaction of its own
    def delete_queryset(self, request, queryset: QuerySet) -> None:
        held = [(self.rights_name(obj), self.rights(obj)) for obj in queryset]
        super().delete_queryset(request, queryset)
        for name, before in held:
            if before != self.no_rights:
                self._announce(request, name, before, {})

    def _announce(self, request, name: str, before: dict, after: dict) -> None:
        services.announce_rights(
            kind=self.rights_kind,
            name=name,
            before=before,
            after=after,
            actor=request.user,
            now=timezone.now(),
        )


admin.site.unregister(get_user_model())


@admin.register(get_user_model())
class UserAdmin(AuditedRightsAdmin, auth_admin.UserAdmin):
    form = UserChangeForm
    add_form = UserCreationForm
    rights_kind = "user"
    no_rights = services.NO_RIGHTS
    # Operator rights too: a delegate could otherwise set a member's password, then make that account an operator.
    superuser_fields = ("is_staff", "is_superuser", "groups", "user_permissions")

    # An operator's account (a superuser's included) is changed and deleted by superusers only, or by its own
    # operator: one who may change accounts would otherwise set a peer's password or name and hold its rights. The
    # password page of an account (user_change_password) asks this too, so it answers 403 alike.
    def has_change_permission(self, request, obj=None) -> bool:
        return super().has_change_permission(request, obj) and not _above(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        return super().has_delete_permission(request, obj) and not _above(request, obj)

    def rights(self, obj) -> dict:
        return services.user_rights(user_id=obj.pk)

    def save_model(self, request, obj, form, change: bool) -> None:
        # How the account signs in, as stored before the save (``obj`` already holds the form's values).
        stored = type(obj)._default_manager.filter(pk=obj.pk).first() if change else None
        super().save_model(request, obj, form, change)
        if stored is not None:
            services.announce_account(
                name=obj.get_username(), before=services.sign_in_details(stored),
                after=services.sign_in_details(obj), actor=request.user, now=timezone.now(),
            )  # fmt: skip

    @transaction.atomic  # the new password and its audit entry commit together
    def user_change_password(self, request, id, form_url=""):
        stored = self.get_object(request, unquote(id))
        response = super().user_change_password(request, id, form_url)
        if request.method == "POST" and response.status_code == 302 and stored is not None:
            changed = type(stored)._default_manager.get(pk=stored.pk)
            services.announce_account(
                name=changed.get_username(), before={"password": _password_said(stored, "was set")},
                after={"password": _password_said(changed, "set anew")}, actor=request.user, now=timezone.now(),
            )  # fmt: skip
        return response

    def rights_name(self, obj) -> str:
        return obj.get_username()

    # Deleting an account would remove its memberships unaudited, and maybe a team's last admin: it leaves its
    # teams on their members pages first.
    def get_deleted_objects(self, objs, request):
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        # Tokens are never deleted on their own (``ApiTokenAdmin``), but go with their account: its deletion is
        # audited, and a token of no account signs nobody in.
        perms_needed.discard(ApiToken._meta.verbose_name)
        for membership in Membership.objects.filter(user__in=objs).select_related("team", "user"):
            protected.append(
                format_html(
                    '{} — remove them on <a href="{}">the members page</a> first',
                    membership,
                    reverse("accounts:members", args=[membership.team.slug]),
                )
            )
        return deleted, counts, perms_needed, protected


def _password_said(user, usable: str) -> str:
    """Whether the account has a password to sign in with, in words: never its hash."""
    return usable if user.has_usable_password() else "none (cannot sign in with one)"


def _above(request, account) -> bool:
    """Whether ``account`` is another operator's (a superuser's included) and the one asking is no superuser."""
    if account is None or request.user.is_superuser or account.pk == request.user.pk:
        return False
    return account.is_staff or account.is_superuser


admin.site.unregister(Group)


@admin.register(Group)
class GroupAdmin(AuditedRightsAdmin, auth_admin.GroupAdmin):
    """A group's permissions are every one of its accounts' rights: their changes are audited as an account's."""

    rights_kind = "group"
    no_rights = services.NO_GROUP_RIGHTS
    superuser_fields = ("permissions",)

    def rights(self, obj) -> dict:
        return services.group_rights(group_id=obj.pk)


class AccessAttemptAdmin(axes_admin.AccessAttemptAdmin):
    """Deleting an access attempt lifts its (username, address)'s lockout: through the writer, audited."""

    def delete_model(self, request, obj: AccessAttempt) -> None:
        attempts = AccessAttempt.objects.filter(id=obj.id)
        services.clear_lockouts(attempts=attempts, actor=request.user, now=timezone.now())

    def delete_queryset(self, request, queryset: QuerySet[AccessAttempt]) -> None:
        services.clear_lockouts(attempts=queryset, actor=request.user, now=timezone.now())


# Axes registers its pages when its admin module is first imported (above, before the admin's autodiscovery
# reaches axes, which comes after accounts in INSTALLED_APPS), and only with AXES_ENABLE_ADMIN.
if admin.site.is_registered(AccessAttempt):
    admin.site.unregister(AccessAttempt)
    admin.site.register(AccessAttempt, AccessAttemptAdmin)
