from django.urls import path

from metering import views

app_name = "metering"

urlpatterns = [
    path("", views.ledger, name="ledger"),
    path("live/", views.ledger_live, name="live"),
    path("export.csv", views.export, {"fmt": "csv"}, name="export_csv"),
    path("export.json", views.export, {"fmt": "json"}, name="export_json"),
    path("check/", views.check, name="check"),
    path("teams/<slug:slug>/budget/", views.budget, name="budget"),
    path("allocations/<int:allocation_id>/adjust/", views.adjust, name="adjust"),
]
