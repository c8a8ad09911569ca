from django.urls import path

from operations import views

app_name = "operations"

# Mounted at /operator/ beside the public app's operator/problems/ and operator/partners/ pages.
urlpatterns = [
    path("pool/", views.pool_view, name="pool"),
    path("pool/nodes/<str:name>/<slug:action>/", views.node_action, name="node-action"),
    path("queue/", views.queue_view, name="queue"),
    path("utilisation/", views.utilisation_view, name="utilisation"),
    path("jobs/", views.jobs_view, name="jobs"),
    path("jobs/<int:job_id>/<slug:action>/", views.job_action, name="job-action"),
    path("teams/", views.teams_view, name="teams"),
    path("teams/<slug:slug>/", views.team_view, name="team"),
    path("health/", views.health_view, name="health"),
    path("health/ledger-check/", views.ledger_check, name="ledger-check"),
    path("audit/", views.audit_view, name="audit"),
]
