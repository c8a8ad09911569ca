"""Ledger rows in the admin: read-only, since the ledger is append-only."""

from django.contrib import admin

from metering.models import MeterEntry


@admin.register(MeterEntry)
class MeterEntryAdmin(admin.ModelAdmin):
    list_display = ("period_start", "period_end", "team", "job", "allocation", "gpus", "seconds", "kind")
    list_filter = ("kind", "team")
    date_hierarchy = "period_start"
    list_select_related = ("team", "job")
    raw_id_fields = ("allocation", "job", "created_by")

    def has_add_permission(self, request) -> bool:
        return False  # corrections go through the adjustment page, which records reason and author

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
