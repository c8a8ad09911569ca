from django.contrib import admin

from accounts.models import ApiToken, Membership, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("name", "share", "monthly_budget_gpu_hours", "budget_enforced")
    inlines = [MembershipInline]
    prepopulated_fields = {"slug": ("name",)}

    # The slug names the team's folder of every data and output root and its S3 prefixes: a rename would
    # leave the old folders to whichever team is later given that slug.
    def get_readonly_fields(self, request, obj=None):
        return ("slug",) if obj is not None else ()

    def get_prepopulated_fields(self, request, obj=None):
        return {} if obj is not None else self.prepopulated_fields


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "label", "created_at", "revoked_at")
    readonly_fields = ("digest", "prefix")
