from django.urls import path

from notifications import views

app_name = "notifications"

urlpatterns = [
    path("", views.email_settings, name="settings"),
    path("webhooks/<slug:team_slug>/", views.webhooks, name="webhooks"),
    path("webhooks/<slug:team_slug>/<int:webhook_id>/remove/", views.remove_webhook, name="remove-webhook"),
]
