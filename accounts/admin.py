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


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "label", "created_at", "revoked_at")
    readonly_fields = ("digest", "prefix")
